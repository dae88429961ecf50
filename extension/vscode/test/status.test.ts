import { strict as assert } from "node:assert";
import { test } from "node:test";

import { StatsTotals } from "../src/stats";
import { MAX_STATUS_MESSAGE, normalizeServerStatus, statusView } from "../src/status";

const computed = {
  latency_ms: 84,
  tokens: 15,
  tokens_per_forward: 2.5,
  cached: false,
  accepted_by_source: { ngram: 12, draft: 0 },
  drafted_by_source: { ngram: 14, draft: 0 },
};

test("$/quickdraft/status params: known states only, one-line message", () => {
  assert.deepEqual(normalizeServerStatus({ state: "loading", message: "converting\n  the target", backend: "local" }), {
    state: "loading",
    message: "converting the target",
    backend: "local",
  });
  assert.deepEqual(normalizeServerStatus({ state: "ready" }), { state: "ready", message: "", backend: undefined });
  assert.equal(normalizeServerStatus({ state: "running" }), undefined);
  assert.equal(normalizeServerStatus({ message: "x" }), undefined);
  assert.equal(normalizeServerStatus(null), undefined);
  assert.equal(normalizeServerStatus(["ready"]), undefined);
});

test("the client's own states come first", () => {
  const totals = new StatsTotals();
  const ready = { state: "ready" as const, message: "" };
  assert.equal(statusView("stopped", ready, totals).text, "$(circle-slash) quickdraft stopped");
  assert.match(statusView("stopped", ready, totals).tooltip, /server stopped/);
  assert.equal(statusView("starting", undefined, totals).text, "$(loading~spin) quickdraft");
});

test("loading with the server's message until it says ready", () => {
  const totals = new StatsTotals();
  const loading = statusView("running", { state: "loading", message: "calibrating step costs (2/5)" }, totals);
  assert.equal(loading.text, "$(loading~spin) quickdraft loading: calibrating step costs (2/5)");
  assert.match(loading.tooltip, /^quickdraft — loading: calibrating step costs \(2\/5\)\nNo completion yet\./);
  assert.equal(loading.alert, undefined);
  const long = "converting qwen2.5-coder-1.5b to the torch format in ~/.cache/quickdraft/models (once)";
  const shortened = statusView("running", { state: "loading", message: long }, totals);
  assert.equal(shortened.text, `$(loading~spin) quickdraft loading: ${long.slice(0, MAX_STATUS_MESSAGE - 1)}…`);
  assert.match(shortened.tooltip, new RegExp(`loading: ${long.replace(/[.()~]/g, "\\$&")}`));
  const ready = statusView("running", { state: "ready", message: "" }, totals);
  assert.equal(ready.text, "$(zap) quickdraft ready");
  assert.match(ready.tooltip, /^quickdraft — ready\n/);
  totals.add(computed);
  assert.equal(
    statusView("running", { state: "ready", message: "" }, totals).text,
    "$(zap) 84 ms · copied 12 of 15 tokens",
  );
});

test("error and unavailable: a clear icon, the message in the tooltip, a coloured item", () => {
  const totals = new StatsTotals();
  totals.add(computed);
  const error = statusView("running", { state: "error", message: "models failed to load: out of memory" }, totals);
  assert.equal(error.text, "$(error) quickdraft error");
  assert.match(error.tooltip, /^quickdraft — error: models failed to load: out of memory\n/);
  assert.equal(error.alert, "error");
  const down = statusView(
    "running",
    { state: "unavailable", message: "cannot reach http://gpu:8000/v1", backend: "openai" },
    totals,
  );
  assert.equal(down.text, "$(warning) quickdraft unavailable");
  assert.match(down.tooltip, /^quickdraft — unavailable: cannot reach http:\/\/gpu:8000\/v1 \[remote engine\]\n/);
  assert.equal(down.alert, "warning");
  const back = statusView("running", { state: "ready", message: "", backend: "openai" }, totals);
  assert.equal(back.text, "$(zap) 84 ms · copied 12 of 15 tokens");
  assert.equal(back.alert, undefined);
});

test("a server that never sends a status is 'starting' until its first stats", () => {
  const totals = new StatsTotals();
  const before = statusView("running", undefined, totals);
  assert.equal(before.text, "$(loading~spin) quickdraft starting");
  assert.match(before.tooltip, /server starting/);
  totals.add(computed);
  const after = statusView("running", undefined, totals);
  assert.equal(after.text, "$(zap) 84 ms · copied 12 of 15 tokens");
  assert.match(after.tooltip, /server running/);
});

test("a cached answer shows 'cached'", () => {
  const totals = new StatsTotals();
  totals.add({ latency_ms: 0.4, tokens: 0, tokens_per_forward: 0, cached: true, source: "typed-ahead" });
  const view = statusView("running", { state: "ready", message: "" }, totals);
  assert.equal(view.text, "$(zap) 0 ms · cached");
  assert.match(view.tooltip, /Last: 0 ms · cached\nanswered from work done before \(typed-ahead\), no model work/);
});

test("loading: the step without the server's 'quickdraft:' and without saying 'loading' twice", () => {
  const totals = new StatsTotals();
  const view = (message: string) => statusView("running", { state: "loading", message }, totals);
  assert.equal(view("loading models").text, "$(loading~spin) quickdraft loading models");
  assert.equal(view("quickdraft: loading models").text, "$(loading~spin) quickdraft loading models");
  assert.equal(
    view("measuring step costs (once per machine)").text,
    "$(loading~spin) quickdraft loading: measuring step costs (once per machine)",
  );
  assert.equal(view("Quickdraft: converting model.gguf").text, "$(loading~spin) quickdraft loading: converting model.gguf");
  assert.equal(view("").text, "$(loading~spin) quickdraft loading");
  assert.match(view("quickdraft: loading models").tooltip, /^quickdraft — loading models\n/);
});

test("ready: a word until the first completion; no draft tried: the latency alone", () => {
  const totals = new StatsTotals();
  const ready = { state: "ready" as const, message: "Qwen2.5-Coder-1.5B + 0.5B draft, llama.cpp" };
  assert.equal(statusView("running", ready, totals).text, "$(zap) quickdraft ready");
  totals.add({
    latency_ms: 310,
    tokens: 15,
    tokens_per_forward: 1,
    cached: false,
    accepted_by_source: { ngram: 0, draft: 0 },
    drafted_by_source: { ngram: 0, draft: 0 },
  });
  const view = statusView("running", ready, totals);
  assert.equal(view.text, "$(zap) 310 ms");
  assert.match(view.tooltip, /^quickdraft — ready: Qwen2.5-Coder-1.5B \+ 0.5B draft, llama.cpp\nLast: 310 ms\n15 tokens, no drafts tried/);
});

test("a next edit shown: the item says so with its latency and speed; the tooltip has its details", () => {
  const totals = new StatsTotals();
  totals.add(computed);
  const ready = { state: "ready" as const, message: "" };
  const last = { feature: "inlineEdit", latency_ms: 45, tokens_per_forward: 3.2, edit_count: 1, tokens: 16 };
  const shown = statusView("running", ready, totals, { visible: true, last });
  assert.equal(shown.text, "$(zap) next edit · 45 ms · 3.2 tokens/forward · Tab");
  assert.match(shown.tooltip, /\nNext edit: 45 ms: 1 edit, 16 tokens, 3\.2 tokens\/forward\nA next edit is shown: Tab applies it/);
  // hidden again: the last completion, the next edit's details stay in the tooltip
  const hidden = statusView("running", ready, totals, { visible: false, last });
  assert.equal(hidden.text, statusView("running", ready, totals).text);
  assert.match(hidden.tooltip, /\nNext edit: 45 ms/);
  assert.doesNotMatch(hidden.tooltip, /is shown/);
  // the server's own state wins over an edit shown
  const loading = statusView("running", { state: "loading", message: "" }, totals, { visible: true, last });
  assert.equal(loading.text, "$(loading~spin) quickdraft loading");
});

test("one of several suggestions shown: the item says which, and how to see the others", () => {
  const totals = new StatsTotals();
  totals.add(computed);
  const ready = { state: "ready" as const, message: "" };
  const view = statusView("running", ready, totals, { visible: false }, "2/3");
  assert.equal(view.text, "$(zap) 84 ms · copied 12 of 15 tokens · 2/3");
  assert.match(view.tooltip, /Suggestion 2 of 3: Alt\+\] \/ Alt\+\[ show the others\./);
  // not while loading, and a next edit shown takes the item
  assert.doesNotMatch(statusView("running", { state: "loading", message: "" }, totals, undefined, "2/3").text, /2\/3/);
  assert.doesNotMatch(statusView("running", ready, totals, { visible: true }, "2/3").text, /2\/3/);
});

test("a request waiting over a second shows a spinner, not the last answer's stats", () => {
  const totals = new StatsTotals();
  totals.add(computed);
  const ready = { state: "ready" as const, message: "" };
  const waiting = statusView("running", ready, totals, undefined, undefined, true);
  assert.equal(waiting.text, "$(loading~spin) quickdraft");
  assert.match(waiting.tooltip, /Waiting for a suggestion: the quickdraft progress item says what the model is doing\./);
  assert.equal(statusView("running", ready, totals, undefined, undefined, false).text, "$(zap) 84 ms · copied 12 of 15 tokens");
  // loading says more than waiting does
  const loading = statusView("running", { state: "loading", message: "loading models" }, totals, undefined, undefined, true);
  assert.equal(loading.text, "$(loading~spin) quickdraft loading models");
});
