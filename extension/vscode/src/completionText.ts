// What an inline completion may put into the document.
//
// A completion never inserts control characters other than tab and newline: a model (above all
// a small or random one) can emit bytes such as U+0011, which VS Code would save into the file.
// The server filters them too; this is the editor's own defence. Pure logic, no `vscode` import.

// C0 controls except tab (U+0009) and line feed (U+000A), DEL, and the C1 controls.
const CONTROL_CHARACTERS = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;

/** `text` without control characters other than tab and newline; CRLF becomes LF. */
export function withoutControlCharacters(text: string): string {
  return text.replace(/\r\n/g, "\n").replace(CONTROL_CHARACTERS, "");
}

/** An inline completion item as far as its text goes (a string, or a snippet's `value`). */
export interface ItemWithInsertText {
  insertText: string | { value: string };
}

/**
 * The items with control characters removed from their insert text (in place: a snippet keeps its
 * class), without those that had only control characters to insert.
 */
export function cleanInsertTexts<T extends ItemWithInsertText>(items: readonly T[]): T[] {
  const kept: T[] = [];
  for (const item of items) {
    const holder = typeof item.insertText === "string" ? undefined : item.insertText;
    const before = holder ? holder.value : (item.insertText as string);
    if (typeof before !== "string") {
      kept.push(item);
      continue;
    }
    const after = withoutControlCharacters(before);
    if (holder) {
      holder.value = after;
    } else {
      item.insertText = after;
    }
    if (after !== "" || before === "") {
      kept.push(item);
    }
  }
  return kept;
}
