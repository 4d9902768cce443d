/* Every URL the dashboard fetches, built relative to the page (document.baseURI), never
 * absolute: the page then works at / as well as behind a reverse proxy that serves it under a
 * path prefix (/prism/), over http or https. */

/** One path segment, escaped (a job id may hold characters that mean something in a URL). */
export function segment(value: string | number): string {
  return encodeURIComponent(String(value));
}

/** "v1/jobs/{job}" plus the rest of the path, every segment escaped; relative (no leading /). */
export function jobPath(job: string, ...rest: (string | number)[]): string {
  return ["v1", "jobs", job, ...rest].map(segment).join("/");
}

/**
 * The absolute URL of a relative API path against base (document.baseURI), with query
 * parameters in the given order. A path that starts with "/" or names a scheme is refused: it
 * would escape the prefix the page is served under.
 */
export function apiUrl(path: string, base: string, query?: Record<string, string | number | undefined>): string {
  if (path.startsWith("/") || /^[a-z][a-z0-9+.-]*:/i.test(path))
    throw new Error(`apiUrl: "${path}" is not a relative path`);
  const url = new URL(path, base);
  url.hash = "";
  for (const [key, value] of Object.entries(query ?? {}))
    if (value !== undefined) url.searchParams.set(key, String(value));
  return url.toString();
}
