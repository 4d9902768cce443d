// A development server, not part of the product: serves a built dist/ and passes /v1/... to a
// running prismd, optionally under a path prefix (as a reverse proxy would), so the dashboard
// can be looked at before prismd embeds it. Loopback only.
//
//   node web/dev-server.mjs --dist build/web/dist --prismd http://127.0.0.1:8080 [--port 8090] [--prefix /prism/]
import fs from "node:fs";
import http from "node:http";
import path from "node:path";

const args = { dist: "build/web/dist", prismd: "http://127.0.0.1:8080", port: 8090, prefix: "/" };
const argv = process.argv.slice(2);
for (let i = 0; i + 1 < argv.length; i += 2) {
  const key = argv[i].replace(/^--/, "");
  if (!(key in args)) {
    console.error(`dev-server.mjs: unknown option ${argv[i]}`);
    process.exit(2);
  }
  args[key] = key === "port" ? Number(argv[i + 1]) : argv[i + 1];
}
if (!args.prefix.endsWith("/")) args.prefix += "/";
const upstream = new URL(args.prismd);
const types = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8" };

http
  .createServer((req, res) => {
    const url = new URL(req.url, "http://localhost");
    if (args.prefix !== "/" && url.pathname === args.prefix.slice(0, -1)) {
      res.writeHead(301, { Location: args.prefix });
      return res.end();
    }
    if (!url.pathname.startsWith(args.prefix)) {
      res.writeHead(404);
      return res.end("not under the prefix\n");
    }
    const rest = "/" + url.pathname.slice(args.prefix.length);
    if (rest.startsWith("/v1/") || rest === "/metrics") {
      const up = http.request(
        { host: upstream.hostname, port: upstream.port, method: req.method, path: rest + url.search, headers: { ...req.headers, host: upstream.host } },
        (r) => {
          res.writeHead(r.statusCode ?? 502, r.headers);
          r.pipe(res);
        },
      );
      up.on("error", (e) => {
        res.writeHead(502, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ error: { code: "unavailable", message: `dev-server: prismd: ${e.message}` } }));
      });
      req.pipe(up);
      return;
    }
    const name = rest === "/" ? "index.html" : path.basename(rest);
    const file = path.join(args.dist, name);
    if (!fs.existsSync(file)) {
      res.writeHead(404);
      return res.end("not found\n");
    }
    res.writeHead(200, { "Content-Type": types[path.extname(name)] ?? "application/octet-stream", "Cache-Control": "no-cache" });
    fs.createReadStream(file).pipe(res);
  })
  .listen(args.port, "127.0.0.1", () => console.log(`dev-server: http://127.0.0.1:${args.port}${args.prefix} -> ${args.dist}, /v1 -> ${args.prismd}`));
