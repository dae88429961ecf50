import { strict as assert } from "node:assert";
import { test } from "node:test";

import { DEFAULT_NEXT_EDIT_DEBOUNCE_MS } from "../src/config";
import { CancellationLike } from "../src/debounce";
import { FocusPoint } from "../src/focus";
import { EditItem } from "../src/nextEdit";
import { AskReason, Cancellation, NextEditController } from "../src/nextEditController";
import { ManualTimers } from "./manualTimers";

const URI = "file:///work/shapes.py";

function point(version: number, line = 1, character = 4, uri = URI): FocusPoint<string> {
  return { uri, version, line, character, target: "editor" };
}

function edit(version: number, text = "breadth", uri = URI): EditItem {
  return {
    text,
    range: { start: { line: 1, character: 11 }, end: { line: 1, character: 16 } },
    textDocument: { uri, version },
  };
}

/** A host whose requests the test answers by hand; the document's version is `version`. */
class Host {
  version = 1;
  requests: { point: FocusPoint<string>; token: CancellationLike; reason: AskReason; answer: (raw: unknown) => void; fail: (e: unknown) => void }[] = [];
  shown: EditItem[][] = [];
  hidden = 0;

  request(p: FocusPoint<string>, token: CancellationLike, reason: AskReason): Promise<unknown> {
    return new Promise((answer, fail) => this.requests.push({ point: p, token, reason, answer, fail }));
  }

  versionOf(uri: string): number | undefined {
    return uri === URI ? this.version : undefined;
  }

  show(_p: FocusPoint<string>, edits: EditItem[]): void {
    this.shown.push(edits);
  }

  hide(): void {
    this.hidden += 1;
  }
}

function setup() {
  const host = new Host();
  const timers = new ManualTimers();
  const controller = new NextEditController<string>(host, DEFAULT_NEXT_EDIT_DEBOUNCE_MS, timers);
  return { host, timers, controller };
}

/** Lets the controller's `await` of an answered request run on. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

test("the cursor resting after a move asks once, after the quiet time", async () => {
  const { host, timers, controller } = setup();
  controller.selectionChanged(point(1, 0, 0)); // the baseline: where the editor was
  controller.selectionChanged(point(1, 1, 0)); // a move: same version
  timers.advance(DEFAULT_NEXT_EDIT_DEBOUNCE_MS - 1);
  assert.equal(host.requests.length, 0);
  controller.selectionChanged(point(1, 1, 4)); // moving on restarts the wait
  timers.advance(DEFAULT_NEXT_EDIT_DEBOUNCE_MS - 1);
  assert.equal(host.requests.length, 0);
  timers.advance(1);
  assert.equal(host.requests.length, 1);
  assert.deepEqual(host.requests[0].point, point(1, 1, 4));
  assert.equal(host.requests[0].reason, "rest");
  host.requests[0].answer({ edits: [edit(1)] });
  await settle();
  assert.deepEqual(host.shown, [[edit(1)]]);
  assert.equal(controller.shown?.point.version, 1);
  assert.equal(controller.counts.shown, 1);
});

test("typing asks nothing: a selection change with a new version, and a change cancels a waiting move", () => {
  const { host, timers, controller } = setup();
  controller.selectionChanged(point(1, 0, 0));
  controller.selectionChanged(point(2, 0, 1)); // typed
  controller.selectionChanged(point(3, 0, 2)); // typed
  timers.advance(10 * DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  assert.equal(host.requests.length, 0);
  controller.selectionChanged(point(3, 1, 0)); // moved
  controller.documentChanged(URI); // ... and typed before the rest was over
  assert.equal(timers.scheduled, 0);
  timers.advance(10 * DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  assert.equal(host.requests.length, 0);
  // a selection change VS Code made by itself (no kind) is no rest either
  controller.selectionChanged(point(4, 1, 0));
  controller.selectionChanged(point(4, 2, 0), false);
  timers.advance(10 * DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  assert.equal(host.requests.length, 0);
});

test("a change of the document cancels the request on its way; its late answer is never shown", async () => {
  const { host, timers, controller } = setup();
  controller.selectionChanged(point(1, 0, 0));
  controller.selectionChanged(point(1, 1, 0));
  timers.advance(DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  const [request] = host.requests;
  assert.equal(request.token.isCancellationRequested, false);
  assert.equal(controller.waiting, true);
  host.version = 2;
  controller.documentChanged(URI);
  assert.equal(request.token.isCancellationRequested, true);
  assert.equal(controller.waiting, false);
  request.answer({ edits: [edit(1)] }); // the server answered anyway, for version 1
  await settle();
  assert.deepEqual(host.shown, []);
  assert.equal(controller.shown, undefined);
  assert.equal(controller.counts.stale, 1);
  // a change of another document cancels nothing
  controller.selectionChanged(point(2, 1, 0));
  controller.selectionChanged(point(2, 1, 2));
  timers.advance(DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  controller.documentChanged("file:///work/other.py");
  assert.equal(host.requests[1].token.isCancellationRequested, false);
});

test("an answer for a version the document has left is dropped even when nothing cancelled it", async () => {
  const { host, controller } = setup();
  void controller.accepted(point(1));
  host.version = 2; // changed without an event reaching the controller (yet)
  host.requests[0].answer({ edits: [edit(1)] });
  await settle();
  assert.deepEqual(host.shown, []);
  assert.equal(controller.counts.stale, 1);
  // and edits for another version than asked are not shown
  void controller.accepted(point(2));
  host.requests[1].answer({ edits: [edit(1)] });
  await settle();
  assert.deepEqual(host.shown, []);
  assert.equal(controller.counts.empty, 1);
});

test("accepting a suggestion asks at once; a newer request cancels the older one", async () => {
  const { host, controller } = setup();
  void controller.accepted(point(1, 3, 0));
  assert.equal(host.requests.length, 1);
  assert.equal(host.requests[0].reason, "accepted");
  host.version = 2;
  void controller.accepted(point(2, 4, 0));
  assert.equal(host.requests[0].token.isCancellationRequested, true);
  host.requests[1].answer({ edits: [edit(2)] });
  host.requests[0].answer({ edits: [edit(1)] });
  await settle();
  assert.deepEqual(host.shown, [[edit(2)]]);
});

test("typing clears the edit shown; moving keeps it and asks nothing meanwhile", async () => {
  const { host, timers, controller } = setup();
  void controller.accepted(point(1));
  host.requests[0].answer({ edits: [edit(1)] });
  await settle();
  assert.equal(host.shown.length, 1);
  controller.selectionChanged(point(1, 2, 0));
  controller.selectionChanged(point(1, 3, 0));
  timers.advance(10 * DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  assert.equal(host.requests.length, 1);
  assert.notEqual(controller.shown, undefined);
  host.version = 2;
  controller.documentChanged(URI);
  assert.equal(controller.shown, undefined);
  assert.equal(host.hidden, 1);
  assert.equal(controller.take(), undefined);
});

test("Tab takes the edit only at its version; Escape and another editor hide it", async () => {
  const { host, controller } = setup();
  void controller.accepted(point(1));
  host.requests[0].answer({ edits: [edit(1)] });
  await settle();
  assert.deepEqual(controller.take(), [edit(1)]);
  assert.equal(controller.shown, undefined);
  assert.equal(host.hidden, 1);

  void controller.accepted(point(1));
  host.requests[1].answer({ edits: [edit(1)] });
  await settle();
  host.version = 2; // changed, and no event said so before Tab
  assert.equal(controller.take(), undefined);
  assert.equal(controller.counts.stale, 1);

  void controller.accepted(point(2));
  host.requests[2].answer({ edits: [edit(2)] });
  await settle();
  controller.dismiss();
  assert.equal(controller.shown, undefined);
  void controller.accepted(point(2));
  host.requests[3].answer({ edits: [edit(2)] });
  await settle();
  controller.editorChanged(point(1, 0, 0, "file:///work/other.py"));
  assert.equal(controller.shown, undefined);
  assert.equal(host.hidden, 4);
});

test("an empty answer, a failed request and an unusable answer show nothing", async () => {
  const { host, controller } = setup();
  void controller.accepted(point(1));
  host.requests[0].answer({ edits: [] });
  await settle();
  void controller.accepted(point(1));
  host.requests[1].fail(new Error("MethodNotFound"));
  await settle();
  void controller.accepted(point(1));
  host.requests[2].answer(undefined);
  await settle();
  assert.deepEqual(host.shown, []);
  assert.equal(controller.counts.empty, 2);
  assert.equal(controller.counts.failed, 1);
});

test("the editor changing cancels a waiting rest and the request on its way", () => {
  const { host, timers, controller } = setup();
  controller.selectionChanged(point(1, 0, 0));
  controller.selectionChanged(point(1, 1, 0));
  controller.editorChanged(undefined);
  timers.advance(10 * DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  assert.equal(host.requests.length, 0);
  void controller.accepted(point(1));
  controller.editorChanged(point(1, 0, 0, "file:///work/other.py"));
  assert.equal(host.requests[0].token.isCancellationRequested, true);
  controller.reset();
});

test("another editor focused asks once its cursor has rested there", () => {
  const { host, timers, controller } = setup();
  const other = point(3, 0, 0, "file:///work/report.py");
  controller.editorChanged(other);
  controller.selectionChanged(other, false); // VS Code reports its selection as it takes the focus
  timers.advance(DEFAULT_NEXT_EDIT_DEBOUNCE_MS - 1);
  assert.equal(host.requests.length, 0);
  timers.advance(1);
  assert.equal(host.requests.length, 1);
  assert.deepEqual(host.requests[0].point, other);
  assert.equal(host.requests[0].reason, "rest");
  controller.editorChanged(point(1)); // and moving on before the rest asks nothing there
  controller.editorChanged(undefined);
  timers.advance(10 * DEFAULT_NEXT_EDIT_DEBOUNCE_MS);
  assert.equal(host.requests.length, 1);
});

test("Cancellation: listeners run once, at once when already cancelled", () => {
  const token = new Cancellation();
  let calls = 0;
  const subscription = token.onCancellationRequested(() => (calls += 1));
  const removed = token.onCancellationRequested(() => (calls += 100));
  removed.dispose();
  token.cancel();
  token.cancel();
  assert.equal(calls, 1);
  assert.equal(token.isCancellationRequested, true);
  token.onCancellationRequested(() => (calls += 10));
  assert.equal(calls, 11);
  subscription.dispose();
});
