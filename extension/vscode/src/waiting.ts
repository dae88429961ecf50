// Requests the server has not answered within a second. While one waits, the status item shows
// a spinner instead of the last answer's stats. The server's work-done progress, which VS Code
// shows as its own status bar item ("quickdraft: reading app.py: 1,280 of 5,800 tokens"), says
// what the model is doing.
//
// Pure logic, no `vscode` import (tested by `npm test`).

import { REAL_TIMERS, Timers } from "./focus";

/** How long a request waits before the item says so (the server shows its progress then too). */
export const WAIT_SHOWN_AFTER_MS = 1000;

export class WaitingRequests {
  private waiting = 0;

  constructor(
    /** called when `active` changes */
    private readonly changed: () => void,
    private readonly timers: Timers = REAL_TIMERS,
    private readonly afterMs = WAIT_SHOWN_AFTER_MS,
  ) {}

  /** Whether a request has waited longer than `afterMs` and is still waiting. */
  get active(): boolean {
    return this.waiting > 0;
  }

  /** `request`, followed: after `afterMs` without an answer it counts as waiting, until it settles. */
  async track<T>(request: PromiseLike<T>): Promise<T> {
    let counted = false;
    const timer = this.timers.setTimeout(() => {
      counted = true;
      this.waiting += 1;
      if (this.waiting === 1) {
        this.changed();
      }
    }, this.afterMs);
    try {
      return await request;
    } finally {
      this.timers.clearTimeout(timer);
      if (counted) {
        this.waiting -= 1;
        if (this.waiting === 0) {
          this.changed();
        }
      }
    }
  }
}
