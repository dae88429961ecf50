// Next edits (`textDocument/copilotInlineEdit`): the server's answer read and checked, and what
// the editor draws for it (struck-through deletions, the inserted text after them, a hover with
// the diff).
//
// Pure logic, no `vscode` import (tested by `npm test`); positions are the LSP's (line and
// UTF-16 character, which is also what VS Code counts).

export interface EditPosition {
  line: number;
  character: number;
}

export interface EditRange {
  start: EditPosition;
  end: EditPosition;
}

/** One edit of a `copilotInlineEdit` answer, as the server sends it. */
export interface EditItem {
  text: string;
  range: EditRange;
  textDocument: { uri: string; version: number };
}

function isWhole(value: unknown): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= 0;
}

function readPosition(raw: unknown): EditPosition | undefined {
  if (!raw || typeof raw !== "object") {
    return undefined;
  }
  const { line, character } = raw as Record<string, unknown>;
  return isWhole(line) && isWhole(character) ? { line, character } : undefined;
}

/** Compares two positions: negative when `a` comes first. */
export function comparePositions(a: EditPosition, b: EditPosition): number {
  return a.line !== b.line ? a.line - b.line : a.character - b.character;
}

function readItem(raw: unknown): EditItem | undefined {
  if (!raw || typeof raw !== "object") {
    return undefined;
  }
  const { text, range, textDocument } = raw as Record<string, unknown>;
  if (typeof text !== "string" || !range || typeof range !== "object") {
    return undefined;
  }
  const start = readPosition((range as Record<string, unknown>).start);
  const end = readPosition((range as Record<string, unknown>).end);
  if (!start || !end || comparePositions(start, end) > 0) {
    return undefined;
  }
  if (!textDocument || typeof textDocument !== "object") {
    return undefined;
  }
  const { uri, version } = textDocument as Record<string, unknown>;
  if (typeof uri !== "string" || typeof version !== "number" || !Number.isInteger(version)) {
    return undefined;
  }
  return { text, range: { start, end }, textDocument: { uri, version } };
}

/** The well-formed items of a `copilotInlineEdit` result (`{edits: [...]}`); [] for anything else. */
export function readInlineEditResult(raw: unknown): EditItem[] {
  if (!raw || typeof raw !== "object" || !Array.isArray((raw as { edits?: unknown }).edits)) {
    return [];
  }
  const items: EditItem[] = [];
  for (const entry of (raw as { edits: unknown[] }).edits) {
    const item = readItem(entry);
    if (item) {
      items.push(item);
    }
  }
  return items;
}

/**
 * The edits that may be shown for the document `uri` at `version`: every one of them for that
 * document at that version, in document order, none overlapping another. Any edit for another
 * version (stale) or overlapping another makes the whole answer unusable: [] (the edits are one
 * change; half of it is not what the model proposed).
 */
export function usableEdits(
  items: readonly EditItem[],
  uri: string,
  version: number,
  sameUri: (a: string, b: string) => boolean = (a, b) => a === b,
): EditItem[] {
  if (items.length === 0) {
    return [];
  }
  if (items.some((item) => item.textDocument.version !== version || !sameUri(item.textDocument.uri, uri))) {
    return [];
  }
  const sorted = [...items].sort((a, b) => comparePositions(a.range.start, b.range.start));
  for (let i = 1; i < sorted.length; i++) {
    if (comparePositions(sorted[i - 1].range.end, sorted[i].range.start) > 0) {
      return [];
    }
  }
  // an edit that changes nothing is not shown (an empty range with no text)
  return sorted.filter((item) => item.text !== "" || comparePositions(item.range.start, item.range.end) !== 0);
}

/** What to draw for one edit. */
export interface EditView {
  /** the text the edit removes (empty range when it only inserts): struck through */
  deletion: EditRange | undefined;
  /** the inserted text's first line, shown after the deletion (`↵ ` for a line break first, ` …` when more lines follow) */
  insertion: { at: EditPosition; label: string; multiline: boolean } | undefined;
  /** the whole lines the edit touches (the hover's range) */
  lines: { first: number; last: number };
  /** the edit as a unified diff of those lines (`- old`, `+ new`), for the hover */
  diff: string;
}

/** The inserted text's first line for an `after` decoration. */
export function insertionLabel(text: string): { label: string; multiline: boolean } {
  const lines = text.split(/\r\n|\r|\n/);
  let first = 0;
  let prefix = "";
  if (lines.length > 1 && lines[0] === "") {
    // a line break first (a new line below): say so, then show that line
    prefix = "↵ ";
    first = 1;
  }
  const more = lines.length - first > 1;
  return { label: `${prefix}${lines[first]}${more ? " …" : ""}`, multiline: lines.length > 1 };
}

/**
 * The view of `item` in a document whose line `n` is `lineAt(n)` (without its line break).
 */
export function editView(item: EditItem, lineAt: (line: number) => string): EditView {
  const { start, end } = item.range;
  const empty = comparePositions(start, end) === 0;
  const oldLines: string[] = [];
  for (let line = start.line; line <= end.line; line++) {
    oldLines.push(lineAt(line));
  }
  const before = oldLines[0].slice(0, start.character);
  const after = oldLines[oldLines.length - 1].slice(end.character);
  const newLines = (before + item.text + after).split(/\r\n|\r|\n/);
  const diff = [...oldLines.map((line) => `- ${line}`), ...newLines.map((line) => `+ ${line}`)].join("\n");
  const insertion = item.text === "" ? undefined : { at: end, ...insertionLabel(item.text) };
  return {
    deletion: empty ? undefined : { start, end },
    insertion,
    lines: { first: start.line, last: end.line },
    diff,
  };
}

/** A Markdown code block of `text` whose fence no run of backticks in it closes. */
export function markdownCodeBlock(text: string, language = "diff"): string {
  const longest = Math.max(2, ...Array.from(text.matchAll(/`+/g), (match) => match[0].length));
  const fence = "`".repeat(longest + 1);
  return `${fence}${language}\n${text}\n${fence}`;
}

/** Whether some edit of `items` touches a line in one of `visible` (the editor's visible ranges). */
export function anyVisible(items: readonly EditItem[], visible: readonly { first: number; last: number }[]): boolean {
  return items.some((item) =>
    visible.some((range) => item.range.start.line <= range.last && item.range.end.line >= range.first),
  );
}

/**
 * What Tab does while an edit is shown: `apply` it when one of its edits is on screen, else
 * `jump` to it first (the cursor goes to the first edit; the next Tab applies).
 */
export function tabAction(
  items: readonly EditItem[],
  visible: readonly { first: number; last: number }[],
): "apply" | "jump" {
  return anyVisible(items, visible) ? "apply" : "jump";
}
