import { strict as assert } from "node:assert";
import { test } from "node:test";

import { ServerLogClassifier } from "../src/serverLog";

test("log records keep their level; lines after one continue it", () => {
  const log = new ServerLogClassifier();
  const levels = [
    "2026-11-01 10:00:00,123 INFO quickdraft.lsp: loading models",
    "llama_model_loader: loaded meta data with 29 key-value pairs",
    "2026-11-01 10:00:01,000 WARNING quickdraft.models: no draft model",
    "2026-11-01 10:00:02,000 DEBUG pygls.protocol: sending",
    "2026-11-01 10:00:03,000 ERROR quickdraft.lsp: request failed",
    "  File \"x.py\", line 3, in f",
    "2026-11-01 10:00:04,000 CRITICAL quickdraft: giving up",
  ].map((line) => log.classify(line).level);
  assert.deepEqual(levels, ["info", "info", "warn", "debug", "error", "error", "error"]);
});

test("progress bars are info, shown as their last state", () => {
  const log = new ServerLogClassifier();
  assert.deepEqual(log.classify("\rconvert:   0%|          | 0/4 [00:00<?, ?it/s]\rconvert:  50%|█████     | 2/4 [00:01<00:01]"), {
    level: "info",
    text: "convert:  50%|█████     | 2/4 [00:01<00:01]",
  });
  assert.equal(log.classify("download model.gguf:  40%|████      | 400M/1.0G [00:10<00:15, 40MB/s]").level, "info");
  // a bar after an error record is still not an error
  log.classify("2026-11-01 10:00:03,000 ERROR quickdraft.lsp: request failed");
  assert.equal(log.classify("calibrate: 100%|██████████| 5/5 [00:14<00:00]").level, "info");
});

test("failures without a log record are errors; other stray output is info", () => {
  assert.equal(new ServerLogClassifier().classify("Traceback (most recent call last):").level, "error");
  assert.equal(new ServerLogClassifier().classify("quickdraft serve: error: unrecognized arguments: --runtime").level, "error");
  assert.equal(new ServerLogClassifier().classify("ValueError: bad model").level, "error");
  const log = new ServerLogClassifier();
  assert.equal(log.classify("main: build = 1 (abc)").level, "info");
  assert.equal(log.classify("Traceback (most recent call last):").level, "error");
  assert.equal(log.classify('  File "serve.py", line 1').level, "error", "the traceback goes on");
});

test("llama.cpp's load warning is a warning; INFO, continuations and tracebacks at their levels", () => {
  const log = new ServerLogClassifier();
  const lines = [
    "llama_model_loader: loaded meta data with 29 key-value pairs",
    "2026-12-01 10:00:00,123 WARNING quickdraft.decoding.llamacpp: llama.cpp: load: control-looking token: " +
      "128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden",
    "  a line that continues the warning",
    "2026-12-01 10:00:00,200 INFO quickdraft.lsp.server: loading: loading models",
    "main: build = 1 (abc)",
    "Traceback (most recent call last):",
    '  File "serve.py", line 1, in <module>',
    "ValueError: a failure",
    "2026-12-01 10:00:01,000 WARNING quickdraft: after the traceback",
    "GGML_ASSERT(n > 0) failed",
  ];
  assert.deepEqual(
    lines.map((line) => log.classify(line).level),
    ["info", "warn", "warn", "info", "info", "error", "error", "error", "warn", "error"],
  );
  assert.equal(new ServerLogClassifier().classify("no errors: 0").level, "info");
  assert.equal(new ServerLogClassifier().classify("ErrorHandler registered").level, "info");
});
