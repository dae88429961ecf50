// The VS Code side of quickdraft: starts `quickdraft serve` over stdio and lets
// vscode-languageclient wire `textDocument/inlineCompletion` (ghost text) and
// `textDocument/completion` (the fallback list) into the editor; next edits
// (`textDocument/copilotInlineEdit`) are asked for and shown by nextEditUi.ts.

import * as readline from "node:readline";

import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  Middleware,
  ServerOptions,
  State,
  TransportKind,
} from "vscode-languageclient/node";

import { CandidateCycle } from "./candidates";
import { cleanInsertTexts } from "./completionText";
import {
  buildConfigTree,
  ConfigTree,
  debounceMs,
  DEFAULT_DEBOUNCE_MS,
  needsRestart,
  nextEditSettings,
  serverCommand,
  ServerCommand,
  SettingsReader,
} from "./config";
import { debounced } from "./debounce";
import { WaitingRequests } from "./waiting";
import { FocusPoint, FocusReporter } from "./focus";
import { NextEdits } from "./nextEditUi";
import { ServerLogClassifier } from "./serverLog";
import { isNextEditStats, normalizeStats, QuickdraftStats, StatsTotals, tooFewTokensPerForward } from "./stats";
import { ClientState, normalizeServerStatus, ServerStatus, statusView } from "./status";

// `next` of the inline completion middleware (its type has no public export in 11.0.0)
type ProvideInlineCompletionItemsSignature = Parameters<NonNullable<Middleware["provideInlineCompletionItems"]>>[4];

const STATS_NOTIFICATION = "$/quickdraft/stats";
const STATUS_NOTIFICATION = "$/quickdraft/status";
/** `{textDocument: {uri}, position}`: the focused document and its cursor (see focus.ts) */
const DID_FOCUS_NOTIFICATION = "textDocument/didFocus";
const DOCUMENT_SELECTOR = [{ scheme: "file" }, { scheme: "untitled" }];

let client: LanguageClient | undefined;
let current: { tree: ConfigTree; command: ServerCommand } | undefined;
let output: vscode.LogOutputChannel;
let statusItem: vscode.StatusBarItem;
let totals = new StatsTotals();
let clientState: ClientState = "stopped";
/** the last `$/quickdraft/status`; undefined until the server sends one (older servers never do) */
let serverStatus: ServerStatus | undefined;
let quietMs = DEFAULT_DEBOUNCE_MS;
let reportedFewTokensPerForward = false;
let focus: FocusReporter<vscode.TextEditor>;
let nextEdits: NextEdits;
/** inline completion requests the server has not answered within a second (the item says so) */
const waitingRequests = new WaitingRequests(() => updateStatus());
/** the last `$/quickdraft/stats` with feature "inlineEdit" (never counted as a completion) */
let lastNextEdit: QuickdraftStats | undefined;
/** which of the shown suggestions VS Code has on screen ("2/3"; see candidates.ts) */
const candidates = new CandidateCycle();
/** whether the last list of suggestions answered an automatic request (VS Code then asks again
 * explicitly before it moves to another item) */
let lastAnswerAutomatic = true;
/** a move (Alt+] / Alt+[) waiting for the explicit list VS Code asks for first */
let pendingMove: 1 | -1 | undefined;

/**
 * Reads only what the user set (user, workspace or folder settings), never the contributed
 * defaults: an unset setting leaves the server's own default (or its command line) in force.
 */
function settingsReader(): SettingsReader {
  const configuration = vscode.workspace.getConfiguration("quickdraft");
  return (key: string) => {
    const inspected = configuration.inspect(key);
    if (!inspected) {
      return undefined;
    }
    return inspected.workspaceFolderValue ?? inspected.workspaceValue ?? inspected.globalValue;
  };
}

function snapshot(): { tree: ConfigTree; command: ServerCommand } {
  const read = settingsReader();
  return { tree: buildConfigTree(read), command: serverCommand(read) };
}

function updateStatus(): void {
  const show = vscode.workspace.getConfiguration("quickdraft").get<boolean>("statusBar.enabled", true);
  if (!show) {
    statusItem.hide();
    return;
  }
  const view = statusView(
    clientState,
    serverStatus,
    totals,
    { visible: nextEdits?.visible ?? false, last: lastNextEdit },
    candidates.label(),
    waitingRequests.active,
  );
  statusItem.text = view.text;
  statusItem.tooltip = view.tooltip;
  statusItem.backgroundColor =
    view.alert === undefined ? undefined : new vscode.ThemeColor(`statusBarItem.${view.alert}Background`);
  statusItem.show();
}

/** The server's stderr, each line at the level of its log record (progress bars are info). */
function pipeServerStderr(input: NodeJS.ReadableStream, channel: vscode.LogOutputChannel): void {
  const classifier = new ServerLogClassifier();
  readline.createInterface({ input, crlfDelay: Infinity, terminal: false }).on("line", (line: string) => {
    const { level, text } = classifier.classify(line);
    if (text !== "") {
      channel[level](text);
    }
  });
}

function pipeServerStdout(input: NodeJS.ReadableStream, channel: vscode.LogOutputChannel): void {
  readline.createInterface({ input, crlfDelay: Infinity, terminal: false }).on("line", (line: string) => {
    channel.info(line);
  });
}

function onStats(params: unknown): void {
  const stats = normalizeStats(params);
  if (isNextEditStats(stats)) {
    lastNextEdit = stats;
    updateStatus();
    return;
  }
  if (tooFewTokensPerForward(stats) && !reportedFewTokensPerForward) {
    reportedFewTokensPerForward = true;
    output.warn(
      `[quickdraft] the server reported ${String(stats.tokens_per_forward)} tokens per forward for a computed ` +
        "answer (every forward yields at least one token)",
    );
  }
  totals.add(stats);
  updateStatus();
}

function onServerStatus(params: unknown): void {
  const status = normalizeServerStatus(params);
  if (!status) {
    output.warn(`[quickdraft] ignored a ${STATUS_NOTIFICATION} without a known state: ${JSON.stringify(params)}`);
    return;
  }
  if (status.state !== serverStatus?.state || status.message !== serverStatus?.message) {
    output.info(`[quickdraft] server ${status.state}${status.message ? `: ${status.message}` : ""}`);
  }
  serverStatus = status;
  updateStatus();
}

/** Waits out `quickdraft.debounceMs` before an automatic request; drops control characters. */
async function provideInlineCompletionItems(
  document: vscode.TextDocument,
  position: vscode.Position,
  context: vscode.InlineCompletionContext,
  token: vscode.CancellationToken,
  next: ProvideInlineCompletionItemsSignature,
): Promise<vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined> {
  const automatic = context.triggerKind === vscode.InlineCompletionTriggerKind.Automatic;
  const result = await debounced(automatic, quietMs, token, () =>
    waitingRequests.track(Promise.resolve(next(document, position, context, token))),
  );
  if (!result) {
    if (!token.isCancellationRequested) {
      answered([], automatic);
    }
    return result;
  }
  // accepting one asks for a next edit at once (quickdraft.inlineCompletionAccepted)
  const items = nextEdits.wrapCommands(cleanInsertTexts(Array.isArray(result) ? result : result.items));
  if (!token.isCancellationRequested) {
    answered(items, automatic);
  }
  if (Array.isArray(result)) {
    return items;
  }
  result.items = items;
  return result;
}

/** A list of suggestions goes to VS Code: the status item follows which one it shows. */
function answered(items: vscode.InlineCompletionItem[], automatic: boolean): void {
  candidates.answered(items.map((item) => (typeof item.insertText === "string" ? item.insertText : item.insertText.value)));
  lastAnswerAutomatic = automatic;
  if (!automatic && pendingMove !== undefined) {
    candidates.moved(pendingMove);
    pendingMove = undefined;
  }
  updateStatus();
}

/**
 * Alt+] / Alt+[: VS Code's own move to the next or previous suggestion, followed in the status
 * item. From a list an automatic request answered VS Code first asks again explicitly and moves
 * once that list is in (candidates.ts), so the move waits for it.
 */
async function moveSuggestion(delta: 1 | -1): Promise<void> {
  if (lastAnswerAutomatic) {
    pendingMove = delta;
  } else {
    candidates.moved(delta);
  }
  updateStatus();
  const command = delta === 1 ? "editor.action.inlineSuggest.showNext" : "editor.action.inlineSuggest.showPrevious";
  await vscode.commands.executeCommand(command);
}

/** The suggestion is gone (the text or the cursor changed, or Escape): no "2/3" any more. */
function suggestionGone(): void {
  if (candidates.label() !== undefined || pendingMove !== undefined) {
    candidates.clear();
    pendingMove = undefined;
    updateStatus();
  }
}

/** The cursor of `editor` when quickdraft serves its document, else undefined. */
function focusPoint(editor: vscode.TextEditor | undefined): FocusPoint<vscode.TextEditor> | undefined {
  if (!editor || vscode.languages.match(DOCUMENT_SELECTOR, editor.document) === 0) {
    return undefined;
  }
  const { line, character } = editor.selection.active;
  const { document } = editor;
  return { uri: document.uri.toString(), version: document.version, line, character, target: editor };
}

function sendDidFocus(point: FocusPoint<vscode.TextEditor>): void {
  const running = client;
  if (!running || running.state !== State.Running) {
    return; // a server that starts is told at its start (reportActiveEditor)
  }
  const converter = running.code2ProtocolConverter;
  const params = {
    textDocument: converter.asTextDocumentIdentifier(point.target.document),
    position: converter.asPosition(new vscode.Position(point.line, point.character)),
  };
  running.sendNotification(DID_FOCUS_NOTIFICATION, params).catch((error: unknown) => {
    output.debug(`[quickdraft] ${DID_FOCUS_NOTIFICATION}: ${error instanceof Error ? error.message : String(error)}`);
  });
}

/** A new server hears which document has the focus now. */
function reportActiveEditor(): void {
  focus.reset();
  focus.focusChanged(focusPoint(vscode.window.activeTextEditor));
}

function onSelectionChanged(event: vscode.TextEditorSelectionChangeEvent): void {
  if (event.textEditor !== vscode.window.activeTextEditor) {
    return;
  }
  const point = focusPoint(event.textEditor);
  if (point) {
    focus.selectionChanged(point, event.kind !== undefined);
  }
  if (event.kind !== undefined) {
    suggestionGone(); // a click or a cursor key hides the ghost text (typing asks again)
  }
  nextEdits.selectionChanged(event);
}

function createClient(config: { tree: ConfigTree; command: ServerCommand }): LanguageClient {
  const serverOptions: ServerOptions = {
    command: config.command.command,
    args: config.command.args,
    transport: TransportKind.stdio,
    options: { env: { ...process.env, PYTHONUNBUFFERED: "1" } },
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: DOCUMENT_SELECTOR,
    outputChannel: output,
    stdioOptions: { stdout: pipeServerStdout, stderr: pipeServerStderr },
    initializationOptions: () => current?.tree ?? config.tree,
    // Nothing here turns off window/workDoneProgress: vscode-languageclient shows the server's
    // loading progress (models loading, converting, calibrating) in VS Code's own progress UI.
    middleware: {
      provideInlineCompletionItems,
      // VS Code shows quickdraft as inline ghost text; the server's textDocument/completion
      // fallback (for clients without inline completion) would only repeat it in the suggest list.
      provideCompletionItem: () => undefined,
      workspace: {
        // A server that pulls `workspace/configuration` for section "quickdraft" gets the tree.
        configuration: async (params, token, next) => {
          const answers = await next(params, token);
          if (!Array.isArray(answers)) {
            return answers;
          }
          return params.items.map((item, index) =>
            item.section === "quickdraft" || item.section === undefined
              ? (current?.tree ?? config.tree)
              : answers[index],
          );
        },
      },
    },
  };
  const created = new LanguageClient("quickdraft", "quickdraft", serverOptions, clientOptions);
  created.onDidChangeState((event) => {
    clientState =
      event.newState === State.Running ? "running" : event.newState === State.Starting ? "starting" : "stopped";
    updateStatus();
  });
  return created;
}

async function startClient(): Promise<void> {
  current = snapshot();
  output.appendLine(`[quickdraft] starting: ${current.command.command} ${current.command.args.join(" ")}`);
  const created = createClient(current);
  client = created;
  created.onNotification(STATS_NOTIFICATION, onStats);
  created.onNotification(STATUS_NOTIFICATION, onServerStatus);
  try {
    await created.start();
    if (client === created) {
      reportActiveEditor();
    }
  } catch (error) {
    clientState = "stopped";
    updateStatus();
    const message = error instanceof Error ? error.message : String(error);
    output.appendLine(`[quickdraft] the server did not start: ${message}`);
    void vscode.window
      .showErrorMessage(
        `quickdraft: the server did not start (${message}). Check "quickdraft.server.path".`,
        "Show Log",
      )
      .then((choice) => {
        if (choice === "Show Log") {
          output.show(true);
        }
      });
  }
}

async function stopClient(): Promise<void> {
  nextEdits.reset();
  const old = client;
  client = undefined;
  if (old) {
    try {
      await old.stop(5000);
    } catch (error) {
      output.appendLine(`[quickdraft] stop: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}

async function restart(): Promise<void> {
  await stopClient();
  totals = new StatsTotals();
  lastNextEdit = undefined;
  serverStatus = undefined;
  await startClient();
}

async function onConfigurationChanged(event: vscode.ConfigurationChangeEvent): Promise<void> {
  if (!event.affectsConfiguration("quickdraft")) {
    return;
  }
  output.appendLine("[quickdraft] configuration change");
  quietMs = debounceMs(settingsReader());
  const nextEdit = nextEditSettings(settingsReader());
  nextEdits.configure(nextEdit.enabled, nextEdit.debounceMs);
  updateStatus();
  const next = snapshot();
  if (!current || !client || needsRestart(current, next)) {
    output.appendLine("[quickdraft] server command or models changed: restarting");
    await restart();
    return;
  }
  current = next;
  if (client.state === State.Running) {
    output.appendLine(`[quickdraft] settings changed: ${JSON.stringify(next.tree)}`);
    await client.sendNotification(DidChangeConfigurationNotification.type, { settings: next.tree });
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("quickdraft", { log: true });
  statusItem = vscode.window.createStatusBarItem("quickdraft.status", vscode.StatusBarAlignment.Right, 100);
  statusItem.name = "quickdraft";
  statusItem.command = "quickdraft.showLog";
  focus = new FocusReporter(sendDidFocus);
  const nextEdit = nextEditSettings(settingsReader());
  nextEdits = new NextEdits(() => client, output, focusPoint, updateStatus, nextEdit.debounceMs);
  nextEdits.configure(nextEdit.enabled, nextEdit.debounceMs);
  context.subscriptions.push(
    output,
    statusItem,
    vscode.commands.registerCommand("quickdraft.restartServer", restart),
    vscode.commands.registerCommand("quickdraft.showLog", () => output.show(true)),
    vscode.commands.registerCommand("quickdraft.nextSuggestion", () => moveSuggestion(1)),
    vscode.commands.registerCommand("quickdraft.previousSuggestion", () => moveSuggestion(-1)),
    vscode.commands.registerCommand("quickdraft.hideSuggestion", async () => {
      suggestionGone();
      await vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
    }),
    vscode.workspace.onDidChangeConfiguration((event) => void onConfigurationChanged(event)),
    vscode.window.onDidChangeActiveTextEditor((editor) => {
      suggestionGone();
      focus.focusChanged(focusPoint(editor));
      nextEdits.editorChanged(editor);
    }),
    vscode.window.onDidChangeTextEditorSelection(onSelectionChanged),
    vscode.workspace.onDidChangeTextDocument((event) => {
      if (event.contentChanges.length > 0) {
        if (event.document === vscode.window.activeTextEditor?.document) {
          suggestionGone(); // accepted, or typed over (a new answer follows)
        }
        focus.documentChanged(event.document.uri.toString());
        nextEdits.documentChanged(event.document.uri.toString());
      }
    }),
    focus,
    nextEdits,
    ...nextEdits.commands(),
  );
  quietMs = debounceMs(settingsReader());
  updateStatus();
  await startClient();
}

export async function deactivate(): Promise<void> {
  await stopClient();
}
