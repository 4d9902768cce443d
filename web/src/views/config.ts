/* The job's config and overrides, editable as JSON. Changes go with the token the user gave
 * (sessionStorage: this tab only) as Authorization: Bearer; prismd's answer is shown, its
 * error.message verbatim when it refuses. An editor the user has touched is not overwritten by
 * a refresh. */
import { ApiError, getJson, getToken, mutate, setToken } from "../api";
import { h, replace, source } from "../dom";
import type { Config, ConfigChange } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

function overridesOf(c: Config): string {
  return JSON.stringify({ force_bf16_blocks: c.force_bf16_blocks, force_int8_blocks: c.force_int8_blocks }, null, 2);
}

export function configView(ctx: ViewContext, job: string): View {
  const configEditor = h("textarea", { id: "config-editor", spellcheck: "false", rows: 28, autocomplete: "off" });
  const overridesEditor = h("textarea", { id: "overrides-editor", spellcheck: "false", rows: 8, autocomplete: "off" });
  const token = h("input", { id: "token-input", type: "password", autocomplete: "off", placeholder: "job or admin token" });
  token.value = getToken();
  const configSave = h("button", { id: "config-save", type: "button" }, "PATCH config");
  const overridesSave = h("button", { id: "overrides-save", type: "button" }, "PUT overrides");
  const status = h("div", { id: "edit-status", role: "status", "aria-live": "polite" });
  const reload = h("button", { id: "config-reload", type: "button", class: "secondary", title: "replace both editors with prismd's config as it is" }, "reload");
  let dirtyConfig = false;
  let dirtyOverrides = false;
  configEditor.addEventListener("input", () => (dirtyConfig = true));
  overridesEditor.addEventListener("input", () => (dirtyOverrides = true));
  token.addEventListener("input", () => setToken(token.value));

  replace(
    ctx.body,
    h(
      "div",
      { class: "config" },
      h(
        "section",
        { class: "panel" },
        h(
          "div",
          { class: "panel-head" },
          h("h2", null, h("label", { for: "config-editor" }, "Config"), " ", h("span", { class: "muted" }, "(PATCH validates every key, applies at the next decision)")),
          source(jobPath(job, "config")),
        ),
        configEditor,
        h("div", { class: "actions" }, reload, configSave),
      ),
      h(
        "section",
        { class: "panel" },
        h("h2", null, h("label", { for: "overrides-editor" }, "Overrides"), " ", h("span", { class: "muted" }, "(PUT replaces both lists)")),
        overridesEditor,
        h("div", { class: "actions" }, overridesSave),
        h("h2", null, h("label", { for: "token-input" }, "Token")),
        h("p", { class: "note" }, "The job's token or the admin token, sent as Authorization: Bearer. Kept for this tab only."),
        token,
        h("h2", null, "prismd's answer"),
        status,
      ),
    ),
  );

  const load = async (force: boolean) => {
    const c = await getJson<Config>(jobPath(job, "config"));
    if (force || !dirtyConfig) {
      configEditor.value = JSON.stringify(c, null, 2);
      dirtyConfig = false;
    }
    if (force || !dirtyOverrides) {
      overridesEditor.value = overridesOf(c);
      dirtyOverrides = false;
    }
  };

  const save = async (button: HTMLButtonElement, method: "PATCH" | "PUT", what: "config" | "overrides", body: string) => {
    setToken(token.value);
    button.disabled = true;
    status.className = "pending";
    status.title = "";
    status.textContent = `${method} ${what}…`;
    try {
      const answer = await mutate<ConfigChange>(method, jobPath(job, what), body);
      status.className = "good";
      status.textContent = `${method} ${what}: accepted, applies ${answer.applies}.`;
      await load(true);
    } catch (e) {
      status.className = "bad";
      status.textContent = e instanceof ApiError ? e.message : String(e);
      status.title = e instanceof ApiError ? `HTTP ${e.status} ${e.code}` : "";
    } finally {
      button.disabled = false;
    }
  };
  reload.addEventListener("click", () =>
    load(true).catch((e: unknown) => {
      status.className = "bad";
      status.textContent = e instanceof ApiError ? e.message : String(e);
    }),
  );
  /* A token given after prismd refused to show the config (--require-read-token): read it now;
   * then the live stream, refused without it, tries again (with it once reads need it). */
  token.addEventListener("change", () => {
    setToken(token.value);
    if (configEditor.value !== "") return ctx.tokenGiven();
    load(false).then(
      () => {
        ctx.error(null);
        ctx.ready();
        ctx.tokenGiven();
      },
      (e: unknown) => {
        ctx.error(e);
        ctx.tokenGiven();
      },
    );
  });
  configSave.addEventListener("click", () => save(configSave, "PATCH", "config", configEditor.value));
  overridesSave.addEventListener("click", () => save(overridesSave, "PUT", "overrides", overridesEditor.value));

  return {
    async refresh(reason) {
      if (reason === "poll" || reason === "decision") return;
      await load(false);
      ctx.ready();
    },
    destroy() {},
  };
}
