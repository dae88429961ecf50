// The VS Code side of quickdraft: starts `quickdraft serve` over stdio and lets
// vscode-languageclient wire `textDocument/inlineCompletion` (ghost text) and
// `textDocument/completion` (the fallback list) into the editor.

import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
  TransportKind,
} from "vscode-languageclient/node";

import { buildConfigTree, ConfigTree, needsRestart, serverCommand, ServerCommand, SettingsReader } from "./config";
import { formatStatusText, formatTooltip, normalizeStats, StatsTotals } from "./stats";

const STATS_NOTIFICATION = "$/quickdraft/stats";

let client: LanguageClient | undefined;
let current: { tree: ConfigTree; command: ServerCommand } | undefined;
let output: vscode.LogOutputChannel;
let statusItem: vscode.StatusBarItem;
let totals = new StatsTotals();
let serverState = "stopped";

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
  if (serverState === "running") {
    statusItem.text = formatStatusText(totals.last);
  } else if (serverState === "starting") {
    statusItem.text = "$(loading~spin) quickdraft";
  } else {
    statusItem.text = "$(circle-slash) quickdraft";
  }
  statusItem.tooltip = formatTooltip(totals, serverState);
  statusItem.show();
}

function createClient(config: { tree: ConfigTree; command: ServerCommand }): LanguageClient {
  const serverOptions: ServerOptions = {
    command: config.command.command,
    args: config.command.args,
    transport: TransportKind.stdio,
    options: { env: { ...process.env, PYTHONUNBUFFERED: "1" } },
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    outputChannel: output,
    initializationOptions: () => current?.tree ?? config.tree,
    middleware: {
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
    serverState =
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
  created.onNotification(STATS_NOTIFICATION, (params: unknown) => {
    totals.add(normalizeStats(params));
    updateStatus();
  });
  try {
    await created.start();
  } catch (error) {
    serverState = "stopped";
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
  await startClient();
}

async function onConfigurationChanged(event: vscode.ConfigurationChangeEvent): Promise<void> {
  if (!event.affectsConfiguration("quickdraft")) {
    return;
  }
  output.appendLine("[quickdraft] configuration change");
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
  context.subscriptions.push(
    output,
    statusItem,
    vscode.commands.registerCommand("quickdraft.restartServer", restart),
    vscode.commands.registerCommand("quickdraft.showLog", () => output.show(true)),
    vscode.workspace.onDidChangeConfiguration((event) => void onConfigurationChanged(event)),
  );
  updateStatus();
  await startClient();
}

export async function deactivate(): Promise<void> {
  await stopClient();
}
