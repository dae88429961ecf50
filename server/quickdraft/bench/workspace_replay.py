"""The workspace scenario of `quickdraft bench --typing`, sent to a real server: the steps
workspace.py planned, one variant's server at a time (typing_replay.TypingBench starts it and
records the requests). A server that does not know `textDocument/didFocus` ignores it or logs
a warning; the scenario runs and reports all the same."""

from __future__ import annotations

import asyncio
from typing import Any

from quickdraft.bench import workspace_report
from quickdraft.bench.editor import EditorDocument
from quickdraft.bench.holes import Hole
from quickdraft.bench.typing_replay import TypingBench
from quickdraft.bench.workspace import Step, WorkspacePlan

FOCUS = "textDocument/didFocus"


def focus_params(doc: EditorDocument, offset: int) -> dict[str, Any]:
    """`textDocument/didFocus`: the document the editor shows now and its cursor."""
    return {"textDocument": {"uri": doc.uri}, "position": doc.position(offset)}


class WorkspaceScenario:
    """The files of `plan` opened together, visited, come back to, moved in; a cold file."""

    name = "workspace"
    report = workspace_report

    def __init__(self, plan: WorkspacePlan, *, open_pause_s: float, think_s: float) -> None:
        self.plan = plan
        self.open_pause_s = open_pause_s
        self.think_s = think_s
        self.holes: dict[str, Hole] = {h.file: h for h in [*plan.visits, *self._cold()]}
        self.index = {hole.file: n for n, hole in enumerate([*plan.visits, *self._cold()])}

    def _cold(self) -> list[Hole]:
        return [self.plan.cold] if self.plan.cold is not None else []

    def environment(self) -> dict[str, Any]:
        return {
            **self.plan.to_dict(),
            "open_pause_s": self.open_pause_s,
            "think_s": self.think_s,
            "steps": len(self.plan.steps),
        }

    def role(self, file: str) -> str:
        return "cold" if self.plan.cold is not None and file == self.plan.cold.file else "visit"

    async def run(self, bench: TypingBench, record: dict[str, Any]) -> None:
        record["files"] = [
            {"file": h.file, "language": h.language, "line": h.line, "role": self.role(h.file)}
            for h in self.holes.values()
        ]
        client = bench.client
        docs: dict[str, EditorDocument] = {}
        asked = 0
        total = sum(1 for step in self.plan.steps if step.action == "ask")
        try:
            for step in self.plan.steps:
                doc = docs.get(step.file) if step.file else None
                if step.action == "open":
                    hole = self.holes[step.file]  # type: ignore[index]
                    doc = docs[hole.file] = EditorDocument(hole.uri, hole.language, hole.text)
                    client.notify("textDocument/didOpen", doc.did_open())
                elif step.action == "pause":
                    if step.label == "open" and step.seconds:
                        bench.say(f"  {len(docs)} files open; pausing {step.seconds:g} s")
                    await asyncio.sleep(step.seconds)
                elif step.action == "focus":
                    client.notify(FOCUS, focus_params(doc, step.offset))  # type: ignore[arg-type]
                elif step.action == "edit":
                    change = doc.edit(step.offset, step.end, step.text)  # type: ignore[union-attr]
                    client.notify("textDocument/didChange", change)
                elif step.action == "ask":
                    asked += 1
                    rec = await bench.ask_and_wait(
                        doc,  # type: ignore[arg-type]
                        step.offset,
                        step.label,
                        fields=self._fields(step),
                    )
                    bench.say(
                        f"  {asked}/{total} {step.label} {step.file}:{rec['line'] + 1}: "
                        f"{rec.get('latency_ms', 0):.0f} ms"
                    )
                else:
                    raise ValueError(f"unknown workspace step {step.action!r}")
        finally:
            if not client.exited:
                for doc in docs.values():
                    client.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
        await bench.settle()
        bench.finish_requests(record)
        bench.say("    " + workspace_report.progress_line(record["requests"]))

    def _fields(self, step: Step) -> dict[str, Any]:
        hole = self.holes[step.file]  # type: ignore[index]
        return {
            "hole": self.index[hole.file],
            "file": hole.file,
            "language": hole.language,
            "file_role": self.role(hole.file),
        }
