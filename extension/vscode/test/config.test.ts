import { strict as assert } from "node:assert";
import { test } from "node:test";

import { buildConfigTree, needsRestart, nextEditSettings, objectReader, serverCommand, toSnake } from "../src/config";

test("toSnake follows config.py", () => {
  assert.equal(toSnake("maxNewTokens"), "max_new_tokens");
  assert.equal(toSnake("draftLength"), "draft_length");
  assert.equal(toSnake("enabled"), "enabled");
  assert.equal(toSnake("max-new-tokens"), "max_new_tokens");
});

test("nothing set gives an empty tree and a bare serve command", () => {
  const read = objectReader({});
  assert.deepEqual(buildConfigTree(read), {});
  assert.deepEqual(serverCommand(read), { command: "quickdraft", args: ["serve"] });
});

test("settings become the snake_case config tree", () => {
  const read = objectReader({
    model: { preset: "qwen2.5-coder-1.5b", device: "cpu", dtype: "int8", calibrate: false },
    decoding: { strategy: "hybrid", maxNewTokens: 48, draftLength: 6, deadlineMs: 500 },
    context: { maxPromptTokens: 1024 },
    languages: {
      python: { enabled: true, draftLength: 4, maxNewTokens: 32, multiline: "never" },
      markdown: { enabled: false },
    },
  });
  assert.deepEqual(buildConfigTree(read), {
    model: { preset: "qwen2.5-coder-1.5b", device: "cpu", dtype: "int8", calibrate: false },
    decoding: { strategy: "hybrid", max_new_tokens: 48, draft_length: 6, deadline_ms: 500 },
    context: { max_prompt_tokens: 1024 },
    languages: {
      python: { enabled: true, draft_length: 4, max_new_tokens: 32, multiline: "never" },
      markdown: { enabled: false },
    },
  });
});

test("unset, null and blank values are left out so the server's own values stay", () => {
  const read = objectReader({
    model: { preset: null, target: "  ", draft: undefined, device: "cpu" },
    decoding: { draftLength: null },
    languages: { python: { draftLength: null, enabled: false }, go: "not an object", rust: null },
  });
  assert.deepEqual(buildConfigTree(read), {
    model: { device: "cpu" },
    languages: { python: { enabled: false } },
  });
});

test("quickdraft.edits reaches the server's edits.* settings, in snake_case", () => {
  const read = objectReader({ edits: { enabled: false, linesAbove: 4, format: " zeta ", historyFiles: null } });
  assert.deepEqual(buildConfigTree(read), { edits: { enabled: false, lines_above: 4, format: "zeta" } });
  assert.deepEqual(buildConfigTree(objectReader({ edits: "not an object" })), {});
});

test("draft 'none' means n-gram drafting only (null in the tree, --draft none on the command line)", () => {
  const read = objectReader({ model: { target: "/m/target", draft: "None" } });
  assert.deepEqual(buildConfigTree(read).model, { target: "/m/target", draft: null });
  assert.deepEqual(serverCommand(read).args, ["serve", "--target", "/m/target", "--draft", "none"]);
});

test("model.runtime is a model setting: in the tree, as --runtime, and a change restarts", () => {
  const read = objectReader({ model: { preset: "qwen2.5-coder-1.5b", runtime: "llamacpp", dtype: "auto" } });
  assert.deepEqual(buildConfigTree(read).model, { preset: "qwen2.5-coder-1.5b", runtime: "llamacpp", dtype: "auto" });
  assert.deepEqual(serverCommand(read).args, [
    "serve",
    "--preset",
    "qwen2.5-coder-1.5b",
    "--runtime",
    "llamacpp",
    "--dtype",
    "auto",
  ]);
  const snap = (runtime: string) => {
    const r = objectReader({ model: { runtime } });
    return { tree: buildConfigTree(r), command: serverCommand(r) };
  };
  assert.equal(needsRestart(snap("torch"), snap("llamacpp")), true);
  assert.equal(needsRestart(snap("torch"), snap("torch")), false);
});

test("server command: path, model flags, --no-calibrate, then the extra args", () => {
  const read = objectReader({
    server: { path: "/opt/venv/bin/quickdraft", args: ["--log-level", "debug", 3, ""] },
    model: { target: "/m/t", draft: "/m/d", device: "cpu", calibrate: false },
  });
  assert.deepEqual(serverCommand(read), {
    command: "/opt/venv/bin/quickdraft",
    args: ["serve", "--target", "/m/t", "--draft", "/m/d", "--device", "cpu", "--no-calibrate", "--log-level", "debug"],
  });
  // calibrate true is the server default: no flag
  assert.deepEqual(serverCommand(objectReader({ model: { calibrate: true } })).args, ["serve"]);
});

test("a model or command change restarts, a decoding change does not", () => {
  const snap = (settings: Record<string, unknown>) => {
    const read = objectReader(settings);
    return { tree: buildConfigTree(read), command: serverCommand(read) };
  };
  const base = snap({ model: { target: "/a", device: "cpu" }, decoding: { maxNewTokens: 32 } });
  assert.equal(needsRestart(base, snap({ model: { device: "cpu", target: "/a" }, decoding: { maxNewTokens: 16 } })), false);
  assert.equal(needsRestart(base, snap({ model: { target: "/b", device: "cpu" }, decoding: { maxNewTokens: 32 } })), true);
  assert.equal(
    needsRestart(base, snap({ server: { args: ["--x"] }, model: { target: "/a", device: "cpu" }, decoding: { maxNewTokens: 32 } })),
    true,
  );
  assert.equal(
    needsRestart(base, snap({ model: { target: "/a", device: "cpu" }, languages: { python: { enabled: false } } })),
    false,
  );
});

test("quickdraft.nextEdit.*: on by default, the rest clamped to whole milliseconds", () => {
  const reader = objectReader;
  assert.deepEqual(nextEditSettings(reader({})), { enabled: true, debounceMs: 600 });
  assert.deepEqual(nextEditSettings(reader({ nextEdit: { enabled: false, debounceMs: 250.4 } })), {
    enabled: false,
    debounceMs: 250,
  });
  assert.equal(nextEditSettings(reader({ nextEdit: { debounceMs: -5 } })).debounceMs, 0);
  assert.equal(nextEditSettings(reader({ nextEdit: { debounceMs: 1e9 } })).debounceMs, 5000);
  assert.equal(nextEditSettings(reader({ nextEdit: { debounceMs: "9" } })).debounceMs, 600);
  // nothing of it reaches the server's configuration tree
  assert.deepEqual(buildConfigTree(reader({ nextEdit: { enabled: false } })), {});
});
