import { strict as assert } from "node:assert";
import { test } from "node:test";

import {
  EditItem,
  editView,
  insertionLabel,
  markdownCodeBlock,
  readInlineEditResult,
  tabAction,
  usableEdits,
} from "../src/nextEdit";

const URI = "file:///work/shapes.py";
const TEXT = ["def area(breadth, height):", "    return width * height", "", "print(area(2, 3))"];
const lineAt = (line: number) => TEXT[line];

function item(text: string, start: [number, number], end: [number, number], version = 7, uri = URI): EditItem {
  return {
    text,
    range: { start: { line: start[0], character: start[1] }, end: { line: end[0], character: end[1] } },
    textDocument: { uri, version },
  };
}

test("the server's answer: well-formed items only, anything else is no edit", () => {
  const good = item("breadth", [1, 11], [1, 16]);
  assert.deepEqual(readInlineEditResult({ edits: [good, { text: 3 }, { ...good, range: null }] }), [good]);
  // a range that ends before it starts, a version that is not an integer, no uri
  assert.deepEqual(readInlineEditResult({ edits: [item("x", [1, 5], [1, 2])] }), []);
  assert.deepEqual(readInlineEditResult({ edits: [{ ...good, textDocument: { uri: URI, version: 7.5 } }] }), []);
  assert.deepEqual(readInlineEditResult({ edits: [{ ...good, textDocument: { version: 7 } }] }), []);
  assert.deepEqual(readInlineEditResult({ edits: [] }), []);
  for (const nothing of [null, undefined, [], "edits", { edits: "x" }]) {
    assert.deepEqual(readInlineEditResult(nothing), []);
  }
  // extra fields (a `command`) are not carried into what is applied
  assert.deepEqual(readInlineEditResult({ edits: [{ ...good, command: { command: "x" } }] }), [good]);
});

test("only edits for the document's version asked about are shown; one stale edit spoils the answer", () => {
  const a = item("breadth", [1, 11], [1, 16]);
  const b = item("", [3, 0], [3, 5]);
  assert.deepEqual(usableEdits([b, a], URI, 7), [a, b]); // document order
  assert.deepEqual(usableEdits([a, item("x", [2, 0], [2, 0], 6)], URI, 7), []);
  assert.deepEqual(usableEdits([a], URI, 8), []);
  assert.deepEqual(usableEdits([a], "file:///work/other.py", 7), []);
  assert.deepEqual(usableEdits([item("x", [1, 0], [1, 12]), a], URI, 7), [], "overlapping edits are not one change");
  assert.deepEqual(usableEdits([item("", [1, 3], [1, 3])], URI, 7), [], "an edit that changes nothing");
  // adjacent edits are fine
  const c = item("y", [1, 16], [1, 17]);
  assert.deepEqual(usableEdits([c, a], URI, 7), [a, c]);
  // a URI the server spells otherwise, when the caller says it is the same document
  const spelled = item("breadth", [1, 11], [1, 16], 7, "file:///work/shapes%2Epy");
  assert.deepEqual(usableEdits([spelled], URI, 7), []);
  assert.deepEqual(usableEdits([spelled], URI, 7, (x, y) => decodeURIComponent(x) === decodeURIComponent(y)), [spelled]);
});

test("a replacement: the old text struck through, the new text after it, the diff of the line", () => {
  const view = editView(item("breadth", [1, 11], [1, 16]), lineAt);
  assert.deepEqual(view.deletion, { start: { line: 1, character: 11 }, end: { line: 1, character: 16 } });
  assert.deepEqual(view.insertion, { at: { line: 1, character: 16 }, label: "breadth", multiline: false });
  assert.deepEqual(view.lines, { first: 1, last: 1 });
  assert.equal(view.diff, "-     return width * height\n+     return breadth * height");
});

test("a pure insertion has no deletion; a pure deletion no insertion", () => {
  const insert = editView(item(", depth", [0, 24], [0, 24]), lineAt);
  assert.equal(insert.deletion, undefined);
  assert.deepEqual(insert.insertion, { at: { line: 0, character: 24 }, label: ", depth", multiline: false });
  assert.equal(insert.diff, "- def area(breadth, height):\n+ def area(breadth, height, depth):");
  const remove = editView(item("", [1, 16], [1, 25]), lineAt);
  assert.deepEqual(remove.deletion, { start: { line: 1, character: 16 }, end: { line: 1, character: 25 } });
  assert.equal(remove.insertion, undefined);
  assert.equal(remove.diff, "-     return width * height\n+     return width");
});

test("a multi-line insertion shows its first line, and the hover has all of it", () => {
  const edit = item("breadth\n    assert breadth > 0\n    return breadth", [1, 11], [1, 16]);
  const view = editView(edit, lineAt);
  assert.deepEqual(view.insertion, { at: { line: 1, character: 16 }, label: "breadth …", multiline: true });
  assert.equal(
    view.diff,
    [
      "-     return width * height",
      "+     return breadth",
      "+     assert breadth > 0",
      "+     return breadth * height",
    ].join("\n"),
  );
  // new lines below a line: the break first, then the line
  assert.deepEqual(insertionLabel("\n    print(area)"), { label: "↵     print(area)", multiline: true });
  assert.deepEqual(insertionLabel("\nx = 1\ny = 2"), { label: "↵ x = 1 …", multiline: true });
  // a replacement across lines: every old line in the diff
  const across = editView(item("pass", [0, 0], [1, 25]), lineAt);
  assert.equal(across.diff, "- def area(breadth, height):\n-     return width * height\n+ pass");
  assert.deepEqual(across.lines, { first: 0, last: 1 });
});

test("the hover's code block is not closed by backticks in the code", () => {
  assert.equal(markdownCodeBlock("- a\n+ b"), "```diff\n- a\n+ b\n```");
  assert.equal(markdownCodeBlock("+ s = ```x```"), "````diff\n+ s = ```x```\n````");
});

test("Tab applies an edit on screen and goes to one off screen first", () => {
  const edits = [item("breadth", [40, 4], [40, 9]), item("breadth", [90, 0], [90, 5])];
  assert.equal(tabAction(edits, [{ first: 30, last: 60 }]), "apply");
  assert.equal(tabAction(edits, [{ first: 0, last: 39 }]), "jump");
  assert.equal(tabAction(edits, [{ first: 0, last: 10 }, { first: 85, last: 95 }]), "apply");
  assert.equal(tabAction([item("x\ny", [10, 0], [20, 0])], [{ first: 15, last: 16 }]), "apply");
});
