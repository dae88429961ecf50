import { strict as assert } from "node:assert";
import { test } from "node:test";

import { FOCUS_DEBOUNCE_MS, FocusPoint, FocusReporter } from "../src/focus";
import { ManualTimers } from "./manualTimers";

function point(uri: string, version: number, line: number, character: number): FocusPoint<string> {
  return { uri, version, line, character, target: `${uri}:${line}:${character}` };
}

function reporter() {
  const timers = new ManualTimers();
  const sent: string[] = [];
  const focus = new FocusReporter<string>((p) => sent.push(p.target), FOCUS_DEBOUNCE_MS, timers);
  return { timers, sent, focus };
}

test("a focus change to a served document is sent at once, once", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 3, 4));
  assert.deepEqual(sent, ["file:///a.py:3:4"]);
  // the click that focused a split editor lands where the cursor already is: no second one
  focus.selectionChanged(point("file:///a.py", 1, 3, 4), true);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:3:4"]);
  focus.focusChanged(point("file:///b.py", 7, 0, 0));
  focus.focusChanged(point("file:///a.py", 1, 3, 4));
  assert.deepEqual(sent, ["file:///a.py:3:4", "file:///b.py:0:0", "file:///a.py:3:4"]);
});

test("focus on a document quickdraft does not serve sends nothing; coming back is a change", () => {
  const { sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.focusChanged(undefined);
  assert.equal(sent.length, 1);
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  assert.deepEqual(sent, ["file:///a.py:0:0", "file:///a.py:0:0"]);
});

test("a cursor move without typing is sent after the quiet time, a burst of moves once", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 5, 0, 0));
  for (let line = 1; line <= 10; line++) {
    focus.selectionChanged(point("file:///a.py", 5, line, 0), true); // an arrow key held down
    timers.advance(50);
  }
  assert.deepEqual(sent, ["file:///a.py:0:0"], "nothing while the keys come faster than the quiet time");
  timers.advance(FOCUS_DEBOUNCE_MS - 51);
  assert.equal(sent.length, 1);
  timers.advance(1);
  assert.deepEqual(sent, ["file:///a.py:0:0", "file:///a.py:10:0"]);
  assert.equal(timers.scheduled, 0);
});

test("typing sends nothing and drops a move waiting to be sent", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.selectionChanged(point("file:///a.py", 1, 2, 0), true); // a click...
  focus.documentChanged("file:///a.py"); // ...then a key typed at once
  focus.selectionChanged(point("file:///a.py", 2, 2, 1), true); // the cursor moved by the key
  focus.documentChanged("file:///a.py");
  focus.selectionChanged(point("file:///a.py", 3, 2, 2), true);
  timers.advance(10 * FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:0:0"]);
  assert.equal(timers.scheduled, 0);
  // a move after the typing is sent, even back to a point sent before the edit
  focus.selectionChanged(point("file:///a.py", 3, 0, 0), true);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:0:0", "file:///a.py:0:0"]);
});

test("a selection event after an edit seen only through the version is typing too", () => {
  // (the selection event may come before the document change event)
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.selectionChanged(point("file:///a.py", 2, 0, 1), true);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:0:0"]);
});

test("a change of another document leaves a waiting move alone", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.selectionChanged(point("file:///a.py", 1, 4, 0), true);
  focus.documentChanged("output:quickdraft"); // the log grows
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:0:0", "file:///a.py:4:0"]);
});

test("a selection change VS Code made by itself (no kind) is not sent", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.selectionChanged(point("file:///a.py", 1, 9, 0), false);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:0:0"]);
  assert.equal(timers.scheduled, 0);
});

test("in an editor whose focus was never reported, the first selection event is only a baseline", () => {
  const { timers, sent, focus } = reporter();
  focus.selectionChanged(point("file:///a.py", 1, 1, 0), true);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, []);
  focus.selectionChanged(point("file:///a.py", 1, 5, 0), true);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:5:0"]);
});

test("a focus change drops the previous editor's waiting move", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.selectionChanged(point("file:///a.py", 1, 8, 0), true);
  focus.focusChanged(point("file:///b.py", 1, 2, 0));
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.deepEqual(sent, ["file:///a.py:0:0", "file:///b.py:2:0"]);
});

test("after reset (a new server) the same focus is sent again; dispose leaves no timer", () => {
  const { timers, sent, focus } = reporter();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  focus.reset();
  focus.focusChanged(point("file:///a.py", 1, 0, 0));
  assert.equal(sent.length, 2);
  focus.selectionChanged(point("file:///a.py", 1, 3, 0), true);
  assert.equal(timers.scheduled, 1);
  focus.dispose();
  assert.equal(timers.scheduled, 0);
  timers.advance(FOCUS_DEBOUNCE_MS);
  assert.equal(sent.length, 2);
});
