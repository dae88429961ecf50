// Next edits in the editor: asks `textDocument/copilotInlineEdit` through the language client
// (when nextEditController.ts says so), draws the answer as decorations (deletions struck
// through, the inserted text after them, a hover with the diff), applies it with Tab
// (`quickdraft.acceptNextEdit`: the first Tab goes to an edit that is off screen, the next one
// applies it; one on screen is applied at once) and dismisses it with Escape
// (`quickdraft.dismissNextEdit`). Ghost text wins Tab: the keybinding needs
// `!inlineSuggestionVisible` (package.json).

import * as vscode from "vscode";
import { LanguageClient, State } from "vscode-languageclient/node";

import { CancellationLike } from "./debounce";
import { FocusPoint } from "./focus";
import { EditItem, EditRange, editView, markdownCodeBlock, tabAction } from "./nextEdit";
import { AskReason, NextEditController } from "./nextEditController";

export const INLINE_EDIT_REQUEST = "textDocument/copilotInlineEdit";
export const DID_SHOW_INLINE_EDIT = "textDocument/didShowInlineEdit";
/** true while a next edit is shown (the Tab and Escape keybindings' condition) */
export const NEXT_EDIT_CONTEXT = "quickdraft.nextEditVisible";
export const ACCEPT_NEXT_EDIT = "quickdraft.acceptNextEdit";
export const DISMISS_NEXT_EDIT = "quickdraft.dismissNextEdit";
/** run by VS Code after an inline completion is accepted (set on each item; see wrapCommands) */
export const COMPLETION_ACCEPTED = "quickdraft.inlineCompletionAccepted";

function toRange(range: EditRange): vscode.Range {
  return new vscode.Range(range.start.line, range.start.character, range.end.line, range.end.character);
}

/** Whether the server answers `textDocument/copilotInlineEdit` (`capabilities.experimental.inlineEdit`). */
export function serverOffersNextEdits(client: LanguageClient): boolean {
  const experimental = client.initializeResult?.capabilities.experimental as Record<string, unknown> | undefined;
  return experimental?.inlineEdit === true;
}

function sameUri(a: string, b: string): boolean {
  if (a === b) {
    return true;
  }
  try {
    return vscode.Uri.parse(a).toString() === vscode.Uri.parse(b).toString();
  } catch {
    return false;
  }
}

export class NextEdits implements vscode.Disposable {
  readonly controller: NextEditController<vscode.TextEditor>;
  private readonly deletion = vscode.window.createTextEditorDecorationType({
    textDecoration: "line-through",
    backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
  });
  private readonly insertion = vscode.window.createTextEditorDecorationType({
    after: {
      backgroundColor: new vscode.ThemeColor("diffEditor.insertedTextBackground"),
      color: new vscode.ThemeColor("gitDecoration.addedResourceForeground"),
      margin: "0 0 0 0.2em",
    },
  });
  /** no style: carries the hover (the diff) over the lines an edit touches */
  private readonly hover = vscode.window.createTextEditorDecorationType({});
  private decorated: vscode.TextEditor | undefined;
  private enabled = true;

  constructor(
    private readonly client: () => LanguageClient | undefined,
    private readonly output: vscode.LogOutputChannel,
    /** the cursor of `editor` when quickdraft serves its document */
    private readonly pointOf: (editor: vscode.TextEditor | undefined) => FocusPoint<vscode.TextEditor> | undefined,
    /** called when an edit is shown or hidden (the status item) */
    private readonly changed: () => void,
    quietMs: number,
  ) {
    this.controller = new NextEditController(
      {
        request: (point, token, reason) => this.request(point, token, reason),
        versionOf: (uri) => vscode.workspace.textDocuments.find((d) => d.uri.toString() === uri)?.version,
        show: (point, edits) => this.show(point, edits),
        hide: () => this.hide(),
      },
      quietMs,
      undefined,
      sameUri,
    );
  }

  get visible(): boolean {
    return this.controller.shown !== undefined;
  }

  /** `quickdraft.nextEdit.*` changed: off stops everything; the rest takes effect at once. */
  configure(enabled: boolean, quietMs: number): void {
    this.enabled = enabled;
    this.controller.quietMs = quietMs;
    if (!enabled) {
      this.controller.reset();
    }
  }

  commands(): vscode.Disposable[] {
    return [
      vscode.commands.registerCommand(ACCEPT_NEXT_EDIT, () => this.accept()),
      vscode.commands.registerCommand(DISMISS_NEXT_EDIT, () => this.controller.dismiss()),
      vscode.commands.registerCommand(COMPLETION_ACCEPTED, (original?: vscode.Command) =>
        this.completionAccepted(original),
      ),
    ];
  }

  /** The items of an inline completion answer, each running COMPLETION_ACCEPTED (then its own command) when accepted. */
  wrapCommands(items: vscode.InlineCompletionItem[]): vscode.InlineCompletionItem[] {
    for (const item of items) {
      const original = item.command;
      item.command = { title: "quickdraft: completion accepted", command: COMPLETION_ACCEPTED, arguments: [original] };
    }
    return items;
  }

  selectionChanged(event: vscode.TextEditorSelectionChangeEvent): void {
    const point = this.enabled ? this.pointOf(event.textEditor) : undefined;
    if (point) {
      this.controller.selectionChanged(point, event.kind !== undefined);
    }
  }

  documentChanged(uri: string): void {
    this.controller.documentChanged(uri);
  }

  editorChanged(editor: vscode.TextEditor | undefined): void {
    this.controller.editorChanged(this.pointOf(editor));
  }

  reset(): void {
    this.controller.reset();
  }

  dispose(): void {
    this.controller.dispose();
    this.deletion.dispose();
    this.insertion.dispose();
    this.hover.dispose();
  }

  private async request(
    point: FocusPoint<vscode.TextEditor>,
    token: CancellationLike,
    reason: AskReason,
  ): Promise<unknown> {
    const running = this.client();
    if (!this.enabled || !running || running.state !== State.Running || !serverOffersNextEdits(running)) {
      return undefined;
    }
    const converter = running.code2ProtocolConverter;
    const params = {
      textDocument: { uri: converter.asUri(point.target.document.uri), version: point.version },
      position: converter.asPosition(new vscode.Position(point.line, point.character)),
    };
    this.output.debug(
      `[quickdraft] ${INLINE_EDIT_REQUEST} (${reason}) at ${point.line + 1}:${point.character + 1}, version ${point.version}`,
    );
    // vscode-languageclient sends $/cancelRequest when `token` is cancelled (the document changed)
    return running.sendRequest(INLINE_EDIT_REQUEST, params, token as vscode.CancellationToken);
  }

  private show(point: FocusPoint<vscode.TextEditor>, edits: EditItem[]): void {
    const editor = point.target;
    const document = editor.document;
    if (
      editor !== vscode.window.activeTextEditor ||
      document.version !== point.version ||
      edits.some((edit) => !document.validateRange(toRange(edit.range)).isEqual(toRange(edit.range)))
    ) {
      this.controller.dismiss(); // not this editor any more, or ranges outside the document
      return;
    }
    const deletions: vscode.DecorationOptions[] = [];
    const insertions: vscode.DecorationOptions[] = [];
    const hovers: vscode.DecorationOptions[] = [];
    for (const edit of edits) {
      const view = editView(edit, (line) => document.lineAt(line).text);
      if (view.deletion) {
        deletions.push({ range: toRange(view.deletion) });
      }
      if (view.insertion) {
        const at = new vscode.Position(view.insertion.at.line, view.insertion.at.character);
        insertions.push({ range: new vscode.Range(at, at), renderOptions: { after: { contentText: view.insertion.label } } });
      }
      const hover = new vscode.MarkdownString(
        `quickdraft next edit: **Tab** applies, **Escape** dismisses\n\n${markdownCodeBlock(view.diff)}`,
      );
      const last = document.lineAt(view.lines.last);
      hovers.push({ range: new vscode.Range(view.lines.first, 0, view.lines.last, last.text.length), hoverMessage: hover });
    }
    editor.setDecorations(this.deletion, deletions);
    editor.setDecorations(this.insertion, insertions);
    editor.setDecorations(this.hover, hovers);
    this.decorated = editor;
    void vscode.commands.executeCommand("setContext", NEXT_EDIT_CONTEXT, true);
    this.output.info(`[quickdraft] next edit shown: ${edits.length} edit(s) in ${document.uri.toString()}`);
    const running = this.client();
    for (const item of edits) {
      running?.sendNotification(DID_SHOW_INLINE_EDIT, { item }).catch((error: unknown) => {
        this.output.debug(`[quickdraft] ${DID_SHOW_INLINE_EDIT}: ${error instanceof Error ? error.message : String(error)}`);
      });
    }
    this.changed();
  }

  private hide(): void {
    const editor = this.decorated;
    this.decorated = undefined;
    if (editor) {
      editor.setDecorations(this.deletion, []);
      editor.setDecorations(this.insertion, []);
      editor.setDecorations(this.hover, []);
    }
    void vscode.commands.executeCommand("setContext", NEXT_EDIT_CONTEXT, false);
    this.changed();
  }

  /** Tab while an edit is shown: go to it when it is off screen, else apply it. */
  private async accept(): Promise<void> {
    const shown = this.controller.shown;
    const editor = shown?.point.target;
    if (!shown || !editor || editor !== vscode.window.activeTextEditor) {
      this.controller.dismiss();
      await vscode.commands.executeCommand("tab"); // what Tab does without an edit
      return;
    }
    const visible = editor.visibleRanges.map((range) => ({ first: range.start.line, last: range.end.line }));
    if (tabAction(shown.edits, visible) === "jump") {
      const start = toRange(shown.edits[0].range).start;
      editor.selection = new vscode.Selection(start, start);
      editor.revealRange(new vscode.Range(start, start), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      return;
    }
    const edits = this.controller.take(); // undefined when the document is not at their version
    if (!edits) {
      this.output.info("[quickdraft] next edit not applied: the document changed since it was proposed");
      await vscode.commands.executeCommand("tab");
      return;
    }
    const workspaceEdit = new vscode.WorkspaceEdit();
    for (const edit of edits) {
      workspaceEdit.replace(editor.document.uri, toRange(edit.range), edit.text);
    }
    const applied = await vscode.workspace.applyEdit(workspaceEdit);
    this.output.info(`[quickdraft] next edit ${applied ? "applied" : "not applied (the editor refused it)"}`);
    const point = applied && this.enabled ? this.pointOf(vscode.window.activeTextEditor) : undefined;
    if (point) {
      await this.controller.accepted(point); // the change may call for another one
    }
  }

  private async completionAccepted(original?: vscode.Command): Promise<void> {
    if (original?.command) {
      await vscode.commands.executeCommand(original.command, ...(original.arguments ?? []));
    }
    const point = this.enabled ? this.pointOf(vscode.window.activeTextEditor) : undefined;
    if (point) {
      await this.controller.accepted(point);
    }
  }
}
