// The PML extension: starts `pml lsp` (stdio) for the `pml` language (`.pml` files).
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration("pml");
  const command = config.get("server.path", "pml");
  const args = ["lsp", ...config.get("server.args", [])];
  client = new LanguageClient(
    "pml",
    "PML language server",
    { command, args },
    { documentSelector: [{ scheme: "file", language: "pml" }] },
  );
  context.subscriptions.push(
    vscode.commands.registerCommand("pml.restartServer", () => client.restart()),
  );
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
