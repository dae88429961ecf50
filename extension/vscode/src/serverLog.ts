// The server's stderr in the extension's log, each line at its own level.
//
// vscode-languageclient logs every stderr line as an error by default; quickdraft's stderr is its
// log (`<date> <time> LEVEL logger: message`) plus progress bars while models load, so that made
// a normal start look like a failure. Pure logic, no `vscode` import (tested by `npm test`).

export type LogLevel = "trace" | "debug" | "info" | "warn" | "error";

const LEVELS: Record<string, LogLevel> = {
  DEBUG: "debug",
  INFO: "info",
  WARNING: "warn",
  WARN: "warn",
  ERROR: "error",
  CRITICAL: "error",
};

// `2026-11-01 10:00:00,123 INFO quickdraft.lsp: ...` (Python logging as `quickdraft serve` sets
// it up); up to two words before the level allow other date formats.
const LOG_RECORD = /^(?:\S+ ){0,2}(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b/;
// tqdm-style bars: ` 40%|████      | 4/10 [00:02<00:03, ...]`
const PROGRESS_BAR = /\d+%\|.*\||\|\s*\d+(\.\d+)?[kMG]?\/\d+(\.\d+)?[kMG]?\s*\[/;
// Output that is a failure whatever came before: a Python traceback, an exception, argparse, a
// fatal error or failed assertion of the native runtime. (The same rules as the Neovim plugin's
// lua/quickdraft/serverlog.lua.)
const FAILURE =
  /^Traceback \(most recent call last\)|^[\w.]*(Error|Exception)\b|(^|\s)error: |^Fatal Python error|GGML_ASSERT|^terminate called/;

export interface ClassifiedLine {
  level: LogLevel;
  text: string;
}

/**
 * Classifies stderr lines one by one. A line that is not a log record continues the record
 * before it (a traceback under `logger.exception` stays an error, a model loader's chatter under
 * an info record stays info); progress bars are info, shown as their last state.
 */
export class ServerLogClassifier {
  private current: LogLevel | undefined;

  classify(line: string): ClassifiedLine {
    // A bar redraws itself with carriage returns: keep what it showed last.
    const segments = line.split("\r").filter((segment) => segment.trim() !== "");
    const text = (segments.length > 0 ? segments[segments.length - 1] : "").trimEnd();
    if (segments.length > 1 || PROGRESS_BAR.test(text)) {
      return { level: "info", text };
    }
    const record = LOG_RECORD.exec(text);
    if (record) {
      this.current = LEVELS[record[1]];
      return { level: this.current, text };
    }
    if (FAILURE.test(text)) {
      this.current = "error";
      return { level: "error", text };
    }
    return { level: this.current ?? "info", text };
  }
}
