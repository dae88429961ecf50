// Settings (`quickdraft.*` in VS Code) -> quickdraft's configuration tree, and the server command.
//
// Pure logic, no `vscode` import, so that `npm test` runs it under node's test runner.
//
// The tree is the shape of server/quickdraft/config.py:
//   {model: {...}, decoding: {...}, context: {...}, edits: {...}, languages: {<id>: {enabled,
//    draft_length, max_new_tokens, multiline}}}
// with snake_case keys. Settings left unset (null / undefined) are omitted, so that they never
// override what the server got on its command line; the server validates everything else.

/** Reads one setting below `quickdraft.` (e.g. `model.target`); undefined when unknown. */
export type SettingsReader = (key: string) => unknown;

export type ConfigTree = {
  model?: Record<string, unknown>;
  decoding?: Record<string, unknown>;
  context?: Record<string, unknown>;
  edits?: Record<string, unknown>;
  languages?: Record<string, Record<string, unknown>>;
};

export interface ServerCommand {
  command: string;
  args: string[];
}

/** `maxNewTokens` -> `max_new_tokens` (the same rule as config.py's `_snake`). */
export function toSnake(key: string): string {
  return key
    .replace(/(?<!^)(?=[A-Z])/g, "_")
    .toLowerCase()
    .replace(/-/g, "_");
}

// setting key below `quickdraft.` -> [section, field] in the tree
const SCALAR_SETTINGS: ReadonlyArray<readonly [string, keyof ConfigTree, string]> = [
  ["model.preset", "model", "preset"],
  ["model.target", "model", "target"],
  ["model.draft", "model", "draft"],
  ["model.device", "model", "device"],
  ["model.runtime", "model", "runtime"],
  ["model.dtype", "model", "dtype"],
  ["model.calibrate", "model", "calibrate"],
  ["decoding.strategy", "decoding", "strategy"],
  ["decoding.maxNewTokens", "decoding", "max_new_tokens"],
  ["decoding.draftLength", "decoding", "draft_length"],
  ["decoding.deadlineMs", "decoding", "deadline_ms"],
  ["decoding.candidates", "decoding", "candidates"],
  ["decoding.minConfidence", "decoding", "min_confidence"],
  ["context.maxPromptTokens", "context", "max_prompt_tokens"],
];

function isSet(value: unknown): boolean {
  return value !== undefined && value !== null && !(typeof value === "string" && value.trim() === "");
}

/** Per-language settings with their keys in snake_case; entries that are not objects are dropped. */
export function languagesTree(value: unknown): Record<string, Record<string, unknown>> {
  const out: Record<string, Record<string, unknown>> = {};
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    return out;
  }
  for (const [languageId, settings] of Object.entries(value as Record<string, unknown>)) {
    if (!settings || typeof settings !== "object" || Array.isArray(settings)) {
      continue;
    }
    const entry: Record<string, unknown> = {};
    for (const [key, setting] of Object.entries(settings as Record<string, unknown>)) {
      // null is meaningful here for draft_length/max_new_tokens ("use the global value"), but it
      // is also the default, so omitting it says the same thing.
      if (setting !== undefined && setting !== null) {
        entry[toSnake(key)] = setting;
      }
    }
    out[languageId] = entry;
  }
  return out;
}

/** The server's next-edit settings (`quickdraft.edits`, an object: `{enabled, linesAbove, ...}`)
 * with their keys in snake_case; unset values left out. */
export function editsTree(value: unknown): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    return out;
  }
  for (const [key, setting] of Object.entries(value as Record<string, unknown>)) {
    if (isSet(setting)) {
      out[toSnake(key)] = typeof setting === "string" ? setting.trim() : setting;
    }
  }
  return out;
}

/** The configuration tree sent as `initializationOptions` and on `didChangeConfiguration`. */
export function buildConfigTree(read: SettingsReader): ConfigTree {
  const tree: ConfigTree = {};
  for (const [key, section, field] of SCALAR_SETTINGS) {
    let value = read(key);
    if (!isSet(value)) {
      continue;
    }
    if (typeof value === "string") {
      value = value.trim();
    }
    if (key === "model.draft" && typeof value === "string" && value.toLowerCase() === "none") {
      value = null; // n-gram drafting only, as `--draft none` on the command line
    }
    const target = (tree[section] ??= {}) as Record<string, unknown>;
    target[field] = value;
  }
  const edits = editsTree(read("edits"));
  if (Object.keys(edits).length > 0) {
    tree.edits = edits;
  }
  const languages = languagesTree(read("languages"));
  if (Object.keys(languages).length > 0) {
    tree.languages = languages;
  }
  return tree;
}

/**
 * How to start the server: `<server.path> serve [model flags] [server.args]`.
 *
 * The model flags repeat what `initializationOptions` carries, so that the server can start
 * loading the models before `initialize` arrives.
 */
export function serverCommand(read: SettingsReader): ServerCommand {
  const path = read("server.path");
  const command = typeof path === "string" && path.trim() !== "" ? path.trim() : "quickdraft";
  const args = ["serve"];
  const model = buildConfigTree(read).model ?? {};
  for (const flag of ["preset", "target", "draft", "device", "runtime", "dtype"]) {
    if (flag in model) {
      const value = model[flag];
      args.push(`--${flag}`, value === null ? "none" : String(value));
    }
  }
  if (model.calibrate === false) {
    args.push("--no-calibrate");
  }
  const extra = read("server.args");
  if (Array.isArray(extra)) {
    for (const arg of extra) {
      if (typeof arg === "string" && arg !== "") {
        args.push(arg);
      }
    }
  }
  return { command, args };
}

/**
 * `quickdraft.debounceMs` when unset: the quiet time after a keystroke before an automatic inline
 * completion request goes to the server. A CPU model needs from a few hundred milliseconds to
 * seconds per request and the server has one worker, so a request sent in the middle of a typing
 * burst mostly costs the next one its wait; 150 ms is longer than the pause between keys inside
 * a word for most typists, and short enough that a suggestion still appears as the typing stops.
 */
export const DEFAULT_DEBOUNCE_MS = 150;
/** The longest quiet time the setting accepts (more would feel like no completion at all). */
export const MAX_DEBOUNCE_MS = 2000;

/** `quickdraft.debounceMs` as whole milliseconds in [0, MAX_DEBOUNCE_MS]; the default when unset. */
export function debounceMs(read: SettingsReader): number {
  const value = read("debounceMs");
  if (typeof value !== "number" || !Number.isFinite(value)) {
    return DEFAULT_DEBOUNCE_MS;
  }
  return Math.min(MAX_DEBOUNCE_MS, Math.max(0, Math.round(value)));
}

function stableJson(value: unknown): string {
  return JSON.stringify(value, (_key, v) =>
    v && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b)))
      : v,
  );
}

/**
 * Whether a change of settings needs a new server process: the command changed, or the models
 * did (loading other weights is a restart, not a reconfiguration).
 */
export function needsRestart(
  before: { tree: ConfigTree; command: ServerCommand },
  after: { tree: ConfigTree; command: ServerCommand },
): boolean {
  return (
    stableJson(before.command) !== stableJson(after.command) ||
    stableJson(before.tree.model ?? {}) !== stableJson(after.tree.model ?? {})
  );
}

/** A reader over a plain nested object such as `{server: {path: "x"}, model: {...}}`. */
export function objectReader(settings: Record<string, unknown>): SettingsReader {
  return (key: string) => {
    let node: unknown = settings;
    for (const part of key.split(".")) {
      if (!node || typeof node !== "object") {
        return undefined;
      }
      node = (node as Record<string, unknown>)[part];
    }
    return node;
  };
}

/** `quickdraft.nextEdit.debounceMs` when unset (see nextEditController.ts). */
export const DEFAULT_NEXT_EDIT_DEBOUNCE_MS = 600;
/** The longest rest the setting accepts. */
export const MAX_NEXT_EDIT_DEBOUNCE_MS = 5000;

/**
 * `quickdraft.nextEdit.enabled` (default true: ask for next edits when the server offers them)
 * and `quickdraft.nextEdit.debounceMs` (the rest of the cursor before asking, whole milliseconds
 * in [0, MAX_NEXT_EDIT_DEBOUNCE_MS]).
 */
export function nextEditSettings(read: SettingsReader): { enabled: boolean; debounceMs: number } {
  const enabled = read("nextEdit.enabled");
  const ms = read("nextEdit.debounceMs");
  return {
    enabled: enabled !== false,
    debounceMs:
      typeof ms === "number" && Number.isFinite(ms)
        ? Math.min(MAX_NEXT_EDIT_DEBOUNCE_MS, Math.max(0, Math.round(ms)))
        : DEFAULT_NEXT_EDIT_DEBOUNCE_MS,
  };
}
