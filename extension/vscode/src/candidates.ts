// Which of the server's suggestions VS Code shows: "2/3" in the status item.
//
// The stable API does not say which item of an inline completion list is on screen, so the
// extension follows VS Code's own rule: its Alt+] / Alt+[ (quickdraft.nextSuggestion /
// quickdraft.previousSuggestion, which run editor.action.inlineSuggest.showNext / showPrevious)
// first ask again explicitly when the list came from an automatic request, then move from the
// item shown (found again by its text in the new list) by one, wrapping around. A new list keeps
// the item shown when it is still there, as VS Code keeps it by its text.
//
// Pure logic, no `vscode` import (tested by `npm test`).

export class CandidateCycle {
  private texts: string[] = [];
  private index = 0;

  /** A list of suggestions was answered (automatic or explicit request): their insert texts. */
  answered(texts: string[]): void {
    const shown = this.texts[this.index];
    this.texts = [...texts];
    const kept = shown === undefined ? -1 : this.texts.indexOf(shown);
    this.index = kept >= 0 ? kept : 0;
  }

  /** VS Code moved to the next (+1) or previous (-1) suggestion, after any new list came. */
  moved(delta: 1 | -1): void {
    const count = this.texts.length;
    if (count > 0) {
      this.index = (this.index + delta + count) % count;
    }
  }

  /** The suggestion went away: accepted, dismissed, or the text or cursor changed. */
  clear(): void {
    this.texts = [];
    this.index = 0;
  }

  /** "2/3" while one of several suggestions is shown, else undefined. */
  label(): string | undefined {
    return this.texts.length > 1 ? `${this.index + 1}/${this.texts.length}` : undefined;
  }
}
