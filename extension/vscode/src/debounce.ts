// The quiet time before an automatic inline completion request goes to the server.
//
// VS Code asks for inline completions on every keystroke and cancels the previous request's token
// when it asks again (vscode-languageclient then sends `$/cancelRequest` for a request already
// sent). Waiting `debounceMs` first means a request superseded during a typing burst is never
// sent at all. Pure logic, no `vscode` import (tested by `npm test`).

/** The part of `vscode.CancellationToken` used here. */
export interface CancellationLike {
  readonly isCancellationRequested: boolean;
  onCancellationRequested(listener: () => unknown): { dispose(): unknown };
}

/**
 * Resolves true after `ms` milliseconds, or false as soon as `token` is cancelled (at once when it
 * already is). Nothing is left scheduled after it resolves.
 */
export function quietPeriod(ms: number, token: CancellationLike): Promise<boolean> {
  if (token.isCancellationRequested) {
    return Promise.resolve(false);
  }
  if (ms <= 0) {
    return Promise.resolve(true);
  }
  return new Promise((resolve) => {
    let subscription: { dispose(): unknown } | undefined;
    let settled = false;
    const settle = (waited: boolean) => {
      if (settled) {
        return;
      }
      settled = true;
      clearTimeout(timer);
      subscription?.dispose();
      resolve(waited);
    };
    const timer = setTimeout(() => settle(!token.isCancellationRequested), ms);
    subscription = token.onCancellationRequested(() => settle(false));
    if (settled) {
      subscription.dispose(); // the listener ran while it was being registered
    }
  });
}

/** How many requests were sent and how many were dropped before being sent. */
export class DebounceCounts {
  sent = 0;
  dropped = 0;
}

/**
 * Runs `send` (the request) after the quiet period when `automatic`, at once when the user asked
 * explicitly; never once `token` is cancelled. Resolves undefined for a request that was not sent.
 */
export async function debounced<T>(
  automatic: boolean,
  ms: number,
  token: CancellationLike,
  send: () => T | PromiseLike<T>,
  counts?: DebounceCounts,
): Promise<T | undefined> {
  const go = automatic ? await quietPeriod(ms, token) : !token.isCancellationRequested;
  if (!go || token.isCancellationRequested) {
    if (counts) {
      counts.dropped += 1;
    }
    return undefined;
  }
  if (counts) {
    counts.sent += 1;
  }
  return send();
}
