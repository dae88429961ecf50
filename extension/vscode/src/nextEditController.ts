// When to ask the server for a next edit, and which answers may be shown and applied.
//
// - The cursor rests: `quickdraft.nextEdit.debounceMs` (600 ms by default) after the last selection change that was not typing
//   (the document's version is the one seen at the selection change before), one request.
// - An inline completion (or a next edit) was accepted: at once.
// - A change of the document cancels the pending request (its token) and hides the edit shown:
//   typing clears it. A late answer (the server answered anyway) is dropped: it is for a version
//   that is not the document's any more.
// - An answer is shown only when all its edits are for the version asked about and that is still
//   the document's version; the same check runs again when it is applied.
// - While an edit is shown, moving the cursor asks nothing (the edit stays until typing, Tab,
//   Escape or another editor).
//
// Pure logic, no `vscode` import (tested by `npm test`); the extension feeds it the events.

import { DEFAULT_NEXT_EDIT_DEBOUNCE_MS } from "./config";
import { CancellationLike } from "./debounce";
import { FocusPoint, Timers } from "./focus";
import { EditItem, readInlineEditResult, usableEdits } from "./nextEdit";

const REAL_TIMERS: Timers = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

/** A cancellation token and its source in one (also what vscode-jsonrpc accepts as a token). */
export class Cancellation implements CancellationLike {
  private cancelled = false;
  private listeners: (() => unknown)[] = [];

  get isCancellationRequested(): boolean {
    return this.cancelled;
  }

  onCancellationRequested(listener: () => unknown): { dispose(): unknown } {
    if (this.cancelled) {
      listener();
      return { dispose: () => undefined };
    }
    this.listeners.push(listener);
    return {
      dispose: () => {
        this.listeners = this.listeners.filter((l) => l !== listener);
      },
    };
  }

  cancel(): void {
    if (this.cancelled) {
      return;
    }
    this.cancelled = true;
    const listeners = this.listeners;
    this.listeners = [];
    for (const listener of listeners) {
      listener();
    }
  }
}

/** Why a request was made. */
export type AskReason = "rest" | "accepted";

/** What the controller needs from the editor and the server. */
export interface NextEditHost<T> {
  /** sends `textDocument/copilotInlineEdit` for `point`; resolves the raw result */
  request(point: FocusPoint<T>, token: CancellationLike, reason: AskReason): Promise<unknown>;
  /** the version of the document `uri` now; undefined when it is not open */
  versionOf(uri: string): number | undefined;
  show(point: FocusPoint<T>, edits: EditItem[]): void;
  hide(): void;
}

/** What happened to the requests so far (for tests and the log). */
export class NextEditCounts {
  asked = 0;
  shown = 0;
  /** answered with no usable edit */
  empty = 0;
  /** answered after the document changed (dropped) */
  stale = 0;
  failed = 0;
}

export interface ShownEdit<T> {
  point: FocusPoint<T>;
  edits: EditItem[];
}

export class NextEditController<T> {
  readonly counts = new NextEditCounts();
  /** the document as last seen at a selection change (its version tells typing from moving) */
  private seen: { uri: string; version: number } | undefined;
  private pending: unknown;
  private inflight: Cancellation | undefined;
  /** the document the request on its way is for */
  private inflightUri: string | undefined;
  private current: ShownEdit<T> | undefined;
  /** where the editor that just took the focus rests (until its first selection change) */
  private focusedAt: FocusPoint<T> | undefined;

  /**
   * @param quietMs the rest before a request (changes take effect at the next selection change)
   * @param sameUri whether an answer's URI names the document asked about (the server may spell
   *   a URI differently, e.g. with its escapes normalized)
   */
  constructor(
    private readonly host: NextEditHost<T>,
    public quietMs: number = DEFAULT_NEXT_EDIT_DEBOUNCE_MS,
    private readonly timers: Timers = REAL_TIMERS,
    private readonly sameUri: (a: string, b: string) => boolean = (a, b) => a === b,
  ) {}

  /** The edit shown now, if any. */
  get shown(): ShownEdit<T> | undefined {
    return this.current;
  }

  /** Whether a request is on its way (sent, not answered). */
  get waiting(): boolean {
    return this.inflight !== undefined;
  }

  /**
   * The selection of the active editor changed. A version other than the one seen last means
   * typing (or another edit): nothing is asked for it. `byUser`: the change has a kind (mouse,
   * keyboard or command), not one VS Code or an extension made.
   */
  selectionChanged(point: FocusPoint<T>, byUser = true): void {
    const focused = this.focusedAt;
    this.focusedAt = undefined;
    if (!byUser && focused && samePlace(focused, point)) {
      return; // the focused editor's selection, reported as it takes the focus: still resting
    }
    const edited = this.seen?.uri !== point.uri || this.seen.version !== point.version;
    this.seen = { uri: point.uri, version: point.version };
    this.cancelTimer();
    if (edited || !byUser || this.current?.point.uri === point.uri) {
      return;
    }
    this.pending = this.timers.setTimeout(() => {
      this.pending = undefined;
      void this.ask(point, "rest");
    }, this.quietMs);
  }

  /** The document `uri` changed: what was asked or shown for it is stale. */
  documentChanged(uri: string): void {
    if (this.seen?.uri === uri) {
      this.cancelTimer();
    }
    if (this.inflightUri === uri) {
      this.cancelRequest();
    }
    if (this.current?.point.uri === uri) {
      this.clear();
    }
  }

  /**
   * Another editor (or none) has the focus: nothing of the old one stays. Its cursor resting
   * there asks after the quiet time, as a move does: an edit made in the other document (a
   * function renamed) may call for one here (its import).
   */
  editorChanged(point: FocusPoint<T> | undefined): void {
    this.cancelTimer();
    this.cancelRequest();
    this.clear();
    this.seen = point && { uri: point.uri, version: point.version };
    this.focusedAt = point;
    if (point) {
      this.pending = this.timers.setTimeout(() => {
        this.pending = undefined;
        void this.ask(point, "rest");
      }, this.quietMs);
    }
  }

  /** An inline completion or a next edit was just accepted at `point`: ask at once. */
  accepted(point: FocusPoint<T>): Promise<void> {
    this.cancelTimer();
    this.seen = { uri: point.uri, version: point.version };
    return this.ask(point, "accepted");
  }

  /** Escape: hide the edit shown. */
  dismiss(): void {
    this.clear();
  }

  /**
   * The edits to apply now (Tab): those shown, when the document is still at their version;
   * undefined otherwise (a stale edit is hidden, never applied).
   */
  take(): EditItem[] | undefined {
    const shown = this.current;
    if (!shown) {
      return undefined;
    }
    this.clear();
    if (this.host.versionOf(shown.point.uri) !== shown.point.version) {
      this.counts.stale += 1;
      return undefined;
    }
    return shown.edits;
  }

  /** Everything stops (the server stops or restarts). */
  reset(): void {
    this.cancelTimer();
    this.cancelRequest();
    this.clear();
    this.seen = undefined;
  }

  dispose(): void {
    this.reset();
  }

  private async ask(point: FocusPoint<T>, reason: AskReason): Promise<void> {
    this.cancelRequest();
    this.clear();
    const token = new Cancellation();
    this.inflight = token;
    this.inflightUri = point.uri;
    this.counts.asked += 1;
    let raw: unknown;
    try {
      raw = await this.host.request(point, token, reason);
    } catch {
      if (this.inflight === token) {
        this.inflight = undefined;
        this.inflightUri = undefined;
      }
      if (!token.isCancellationRequested) {
        this.counts.failed += 1;
      } else {
        this.counts.stale += 1;
      }
      return;
    }
    if (this.inflight === token) {
      this.inflight = undefined;
      this.inflightUri = undefined;
    }
    if (token.isCancellationRequested || this.host.versionOf(point.uri) !== point.version) {
      this.counts.stale += 1;
      return;
    }
    const edits = usableEdits(readInlineEditResult(raw), point.uri, point.version, this.sameUri);
    if (edits.length === 0) {
      this.counts.empty += 1;
      return;
    }
    this.current = { point, edits };
    this.counts.shown += 1;
    this.host.show(point, edits);
  }

  private clear(): void {
    if (this.current) {
      this.current = undefined;
      this.host.hide();
    }
  }

  private cancelRequest(): void {
    if (this.inflight) {
      this.inflight.cancel();
      this.inflight = undefined;
      this.inflightUri = undefined;
    }
  }

  private cancelTimer(): void {
    if (this.pending !== undefined) {
      this.timers.clearTimeout(this.pending);
      this.pending = undefined;
    }
  }
}

function samePlace<T>(a: FocusPoint<T>, b: FocusPoint<T>): boolean {
  return a.uri === b.uri && a.version === b.version && a.line === b.line && a.character === b.character;
}
