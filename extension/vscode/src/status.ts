// The status bar item: the server's state (`$/quickdraft/status`) and the last completion's
// stats (`$/quickdraft/stats`).
//
// Pure logic, no `vscode` import (tested by `npm test`).

import {
  formatNextEdit,
  formatNextEditDetails,
  formatStatusText,
  formatTooltip,
  QuickdraftStats,
  StatsTotals,
} from "./stats";

export const SERVER_STATES = ["loading", "ready", "error", "unavailable"] as const;
export type ServerState = (typeof SERVER_STATES)[number];

/** The params of `$/quickdraft/status`. */
export interface ServerStatus {
  state: ServerState;
  /** one line for a person: the loading step, or why there are no completions */
  message: string;
  /** "local" | "openai" */
  backend?: string;
}

/** The notification's params, or undefined when they name no known state (then ignored). */
export function normalizeServerStatus(raw: unknown): ServerStatus | undefined {
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) {
    return undefined;
  }
  const { state, message, backend } = raw as Record<string, unknown>;
  if (typeof state !== "string" || !(SERVER_STATES as readonly string[]).includes(state)) {
    return undefined;
  }
  return {
    state: state as ServerState,
    message: typeof message === "string" ? message.replace(/\s+/g, " ").trim() : "",
    backend: typeof backend === "string" ? backend : undefined,
  };
}

/** The language client's own state: the process is starting, running (initialized) or not. */
export type ClientState = "starting" | "running" | "stopped";

export interface StatusView {
  text: string;
  tooltip: string;
  /** the item's background: "error" (no completions possible) or "warning" (remote failing) */
  alert?: "error" | "warning";
}

/** Longest message shown in the status bar itself; the tooltip has all of it. */
export const MAX_STATUS_MESSAGE = 48;

function shorten(message: string): string {
  return message.length <= MAX_STATUS_MESSAGE ? message : `${message.slice(0, MAX_STATUS_MESSAGE - 1)}…`;
}

function withMessage(prefix: string, message: string): string {
  return message === "" ? prefix : `${prefix}: ${message}`;
}

/** The server's step as a person reads it: without a leading `quickdraft:` (the item says whose). */
export function stepText(step: string): string {
  return step.trim().replace(/^quickdraft:\s*/i, "");
}

/**
 * `<state>: <step>`, or the step alone where it starts with the state's word (`loading models`,
 * not `loading: loading models`), or the state alone without a step. The same rule as the Neovim
 * plugin's status.with_step.
 */
export function withStep(state: string, step: string, shortened = true): string {
  let text = stepText(step);
  if (text === "") {
    return state;
  }
  text = shortened ? shorten(text) : text;
  const first = /^[A-Za-z]+/.exec(text);
  return first && first[0].toLowerCase() === state ? text : `${state}: ${text}`;
}

/** The next edit's part of the item: whether one is shown now, and the last one's stats. */
export interface NextEditStatus {
  visible: boolean;
  last?: QuickdraftStats;
}

/**
 * What the item shows. A server that never sends `$/quickdraft/status` (older ones) is "starting"
 * until its first stats arrive; one that does is "loading" until it says "ready". `waiting`: a
 * request has waited over a second (waiting.ts); the item then shows a spinner, not old stats.
 */
export function statusView(
  client: ClientState,
  server: ServerStatus | undefined,
  totals: StatsTotals,
  nextEdit?: NextEditStatus,
  candidate?: string,
  waiting = false,
): StatusView {
  let text: string;
  let headline: string;
  let alert: StatusView["alert"];
  if (client === "stopped") {
    text = "$(circle-slash) quickdraft stopped";
    headline = "server stopped";
  } else if (client === "starting") {
    // (bare: the language client itself is starting; "quickdraft starting" once it runs)
    text = "$(loading~spin) quickdraft";
    headline = "server starting";
  } else if (server === undefined) {
    if (totals.last) {
      text = formatStatusText(totals.last);
      headline = "server running";
    } else {
      text = "$(loading~spin) quickdraft starting";
      headline = "server starting (the first completion shows that it is ready)";
    }
  } else if (server.state === "loading") {
    text = `$(loading~spin) quickdraft ${withStep("loading", server.message)}`;
    headline = withStep("loading", server.message, false);
  } else if (server.state === "error") {
    text = "$(error) quickdraft error";
    headline = withMessage("error", server.message);
    alert = "error";
  } else if (server.state === "unavailable") {
    text = "$(warning) quickdraft unavailable";
    headline = withMessage("unavailable", server.message);
    alert = "warning";
  } else {
    text = formatStatusText(totals.last);
    headline = withMessage("ready", server.message);
  }
  if (server?.backend === "openai") {
    headline += " [remote engine]";
  }
  let tooltip = formatTooltip(totals, `quickdraft — ${headline}`);
  const serving = client === "running" && (server === undefined || server.state === "ready");
  if (waiting && serving && !nextEdit?.visible) {
    // a request has waited over a second: not the last answer's stats, but that one is coming
    text = "$(loading~spin) quickdraft";
    tooltip += "\nWaiting for a suggestion: the quickdraft progress item says what the model is doing.";
  } else if (nextEdit?.visible && serving) {
    // an edit is shown: the item says so (its latency and speed), Tab applies it
    text = `$(zap) ${formatNextEdit(nextEdit.last)} · Tab`;
  } else if (candidate !== undefined && serving) {
    // one of several suggestions is shown ("2/3"): Alt+] / Alt+[ cycle through them
    text += ` · ${candidate}`;
    tooltip += `\nSuggestion ${candidate.replace("/", " of ")}: Alt+] / Alt+[ show the others.`;
  }
  if (nextEdit?.last) {
    tooltip += `\nNext edit: ${formatNextEditDetails(nextEdit.last)}`;
  }
  if (nextEdit?.visible) {
    tooltip += "\nA next edit is shown: Tab applies it, Escape dismisses it.";
  }
  return { text, tooltip, alert };
}
