// When to tell the server which document has the focus and where its cursor is:
// `textDocument/didFocus` (the Copilot language server's notification, `{textDocument: {uri}}`,
// plus quickdraft's `position`), so that it can prepare that document before the next keystroke.
//
// - The active editor changes to a document quickdraft serves: at once, once per change.
// - The cursor moves without typing (mouse, keyboard or a command, no document change since the
//   last selection event): after FOCUS_DEBOUNCE_MS without another move, so that holding an arrow
//   key or dragging sends one notification, not one per step.
// - Typing sends nothing: the server has didChange and the inline completion request for that.
//
// Pure logic, no `vscode` import (tested by `npm test`); the extension feeds it the events.

/** Quiet time after the last cursor move before didFocus is sent for it. */
export const FOCUS_DEBOUNCE_MS = 300;

/** Where the cursor of the focused editor stands, and `target` for `send`. */
export interface FocusPoint<T> {
  /** the document's URI as a string (its identity) */
  readonly uri: string;
  /** the document's version: a different one at the next selection event means typing */
  readonly version: number;
  readonly line: number;
  readonly character: number;
  /** what `send` gets back (the editor and its position in the extension) */
  readonly target: T;
}

/** The part of the timer API used here (node's or a test's). */
export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const REAL_TIMERS: Timers = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

export class FocusReporter<T> {
  /** the focused document as last seen (its version tells typing from moving) */
  private seen: { uri: string; version: number } | undefined;
  /** the last point sent: the same one again is not news */
  private lastSent: string | undefined;
  private pending: unknown;

  constructor(
    private readonly send: (point: FocusPoint<T>) => void,
    private readonly quietMs: number = FOCUS_DEBOUNCE_MS,
    private readonly timers: Timers = REAL_TIMERS,
  ) {}

  /** The active editor changed: `point` is its cursor, undefined when the document is not served. */
  focusChanged(point: FocusPoint<T> | undefined): void {
    this.cancel();
    this.seen = point && { uri: point.uri, version: point.version };
    if (point) {
      this.sendOnce(point);
    } else {
      this.lastSent = undefined; // coming back to the same point is a focus change again
    }
  }

  /**
   * The selection of the active editor changed. `byUser`: the change has a kind (mouse, keyboard
   * or command), not one VS Code made by itself. A document version other than the one seen last
   * means the change came from typing (or another edit): nothing is sent for it.
   */
  selectionChanged(point: FocusPoint<T>, byUser: boolean): void {
    const known = this.seen?.uri === point.uri;
    const edited = !known || this.seen?.version !== point.version;
    this.seen = { uri: point.uri, version: point.version };
    this.cancel();
    if (edited || !byUser) {
      // an editor whose focus was never reported is a baseline only: its change may be typing
      return;
    }
    this.pending = this.timers.setTimeout(() => {
      this.pending = undefined;
      this.sendOnce(point);
    }, this.quietMs);
  }

  /** A document changed: a move waiting to be reported there is stale (typing follows it). */
  documentChanged(uri: string): void {
    if (this.seen?.uri === uri) {
      this.cancel();
    }
  }

  /** Forget what was sent (a new server knows nothing yet) and drop a waiting move. */
  reset(): void {
    this.cancel();
    this.seen = undefined;
    this.lastSent = undefined;
  }

  dispose(): void {
    this.cancel();
  }

  private cancel(): void {
    if (this.pending !== undefined) {
      this.timers.clearTimeout(this.pending);
      this.pending = undefined;
    }
  }

  private sendOnce(point: FocusPoint<T>): void {
    const key = `${point.uri}@${point.version}:${point.line}:${point.character}`;
    if (key === this.lastSent) {
      return;
    }
    this.lastSent = key;
    this.send(point);
  }
}
