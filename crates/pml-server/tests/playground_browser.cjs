// The playground in a real browser: Debian's Chromium, headless, driven over CDP by
// playwright-core (scripts/setup-browser-test.sh installs both). Run by playground_browser.rs:
//
//   NODE_PATH=… node playground_browser.cjs URL SCHEMA_NAME PROMPT SCREENSHOT
//
// It loads the page, sees the schema's text, enters a prompt that imports a module the schema does
// not have and waits for that diagnostic to appear, types the valid prompt and waits for it to
// clear, runs it and waits for the three answers (reuse, blend, full), each with a time to first
// token and a strip of tokens (reused and new ones, and blend's recomputed ones), takes a
// screenshot, uploads the schema from its editor, and has the chat tab answer a message. It prints
// `{"passed": true, ...}` or fails with the reason. With PROMPT `-` (a server without schemas) it
// only checks that the page starts from its example schema and says why, without errors.
const { chromium } = require("playwright-core");

const [url, schemaName, prompt, screenshot] = process.argv.slice(2);
if (!screenshot) {
  console.error("usage: node playground_browser.cjs URL SCHEMA_NAME PROMPT SCREENSHOT");
  process.exit(2);
}
const TIMEOUT_MS = 120_000;

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.PML_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    // This machine's network is closed: Chromium's background connections would only fail.
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const report = {};
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
    const errors = [];
    page.on("pageerror", (error) => errors.push(error.message));
    page.on("console", (message) => {
      if (message.type() === "error") errors.push(message.text());
    });
    await page.goto(url, { waitUntil: "load" });

    // The loaded schema's text arrives in its editor.
    await page.waitForFunction(
      (name) => document.querySelector("#schema-editor").textContent.includes(`name="${name}"`),
      schemaName,
      { timeout: TIMEOUT_MS },
    );
    if (prompt === "-") {
      const status = (await page.locator("#status").textContent()).trim();
      if (!status.includes("no schema is loaded")) throw new Error(`status: "${status}"`);
      await page.locator("#schema-diagnostics li.clean").waitFor({ timeout: TIMEOUT_MS });
      if (errors.length) throw new Error(`errors on the page: ${errors.join("; ")}`);
      console.log(JSON.stringify({ passed: true, status }, null, 1));
      return;
    }

    // A prompt importing a module the schema lacks: its diagnostic appears, with code and span.
    const broken = prompt.replace(/<prompt([^>]*)>/, "<prompt$1><no-such-module/>");
    await typeInto(page, "#prompt-editor", broken);
    const diagnostic = page.locator("#prompt-diagnostics li.diagnostic.error").first();
    await diagnostic.waitFor({ timeout: TIMEOUT_MS });
    report.diagnostic = (await diagnostic.textContent()).trim();
    if (!/PML\d+/.test(report.diagnostic)) throw new Error(`no code in: ${report.diagnostic}`);
    if ((await page.locator("#prompt-editor mark.error").count()) === 0) {
      throw new Error("the diagnostic's span is not marked in the editor");
    }
    if (!(await page.locator("#run").isDisabled())) throw new Error("Run is enabled on an error");

    // The valid prompt: the diagnostic clears and Run is offered.
    await typeInto(page, "#prompt-editor", prompt);
    await page.locator("#prompt-diagnostics li.clean").waitFor({ timeout: TIMEOUT_MS });
    if ((await page.locator("#prompt-diagnostics li.diagnostic").count()) !== 0) {
      throw new Error("a diagnostic stayed after the fix");
    }
    await page.locator("#run:not([disabled])").waitFor({ timeout: TIMEOUT_MS });

    // Run: three answers, each with its TTFT and a coloured strip of the prompt's tokens.
    await page.click("#run");
    for (const mode of ["reuse", "blend", "full"]) {
      const pane = page.locator(`#run-${mode}`);
      await page.waitForSelector(`#run-${mode}:is([data-state=done], [data-state=failed])`, {
        timeout: TIMEOUT_MS,
      });
      if ((await pane.getAttribute("data-state")) === "failed") {
        throw new Error(`${mode} failed: ${await pane.locator(".figures").textContent()}`);
      }
      const answer = (await pane.locator(".answer").textContent()).trim();
      const figures = (await pane.locator(".figures").textContent()).trim();
      const kinds = {};
      for (const kind of ["reused", "recomputed", "new"]) {
        kinds[kind] = await pane.locator(`.strip .token.${kind}`).count();
      }
      report[mode] = { answer, figures, kinds };
      if (!answer) throw new Error(`${mode}: no answer`);
      if (!/TTFT \d+ ms/.test(figures)) throw new Error(`${mode}: no TTFT in "${figures}"`);
      if (kinds.new === 0) throw new Error(`${mode}: no new tokens in the strip`);
      // The strip tells each token what usage counts: they must agree.
      const counted = /(\d+) reused · (\d+) recomputed · (\d+) new/.exec(figures);
      const shown = [kinds.reused, kinds.recomputed, kinds.new].join(",");
      if (!counted || counted.slice(1).join(",") !== shown) {
        throw new Error(`${mode}: the strip (${shown}) differs from usage ("${figures}")`);
      }
      if (mode !== "full" && kinds.reused === 0) throw new Error(`${mode}: no reused tokens`);
      if (mode === "blend" && kinds.recomputed === 0) throw new Error("blend: none recomputed");
      if (mode === "full" && kinds.reused + kinds.recomputed !== 0) {
        throw new Error("full: tokens shown as reused");
      }
    }
    if (!/est\. fidelity/.test(report.blend.figures)) {
      throw new Error(`blend: no estimated fidelity in "${report.blend.figures}"`);
    }
    if ((await page.locator("#layout .unit").count()) === 0) throw new Error("no layout blocks");
    await page.screenshot({ path: screenshot, fullPage: true });

    // Upload the schema from its editor: the server lays it out again, finds every unit in the
    // store, and the page follows its status to `ready`.
    await page.click("#upload");
    await page.waitForFunction(
      () => /: ready \(\d+\/\d+ units\)/.test(document.querySelector("#status").textContent),
      null,
      { timeout: TIMEOUT_MS },
    );
    report.upload = (await page.locator("#status").textContent()).trim();

    // The chat tab: a message, an answer streamed into its bubble until the model ends its turn.
    await page.click("[data-tab=chat]");
    await page.fill("#chat-input", "Reply with one word: hello.");
    await page.press("#chat-input", "Enter");
    await page.waitForSelector("#chat-log:is([data-state=done], [data-state=failed])", {
      timeout: TIMEOUT_MS,
    });
    report.chat = (await page.locator("#chat-log .bubble.assistant").last().textContent()).trim();
    if ((await page.locator("#chat-log").getAttribute("data-state")) !== "done" || !report.chat) {
      throw new Error(`the chat did not answer: "${report.chat}"`);
    }
    if (errors.length) throw new Error(`errors on the page: ${errors.join("; ")}`);
    console.log(JSON.stringify({ passed: true, ...report }, null, 1));
  } catch (error) {
    // What the page showed when it failed, beside the reason.
    const pages = browser.contexts().flatMap((context) => context.pages());
    if (pages.length) await pages[0].screenshot({ path: screenshot, fullPage: true });
    throw error;
  } finally {
    await browser.close();
}
}

main().catch((error) => {
  console.error(error.stack || String(error));
  process.exit(1);
});

// Replaces an editor's text: selects it all with the keyboard, deletes it, and pastes the new
// text (a clipboard event the editor handles as a user's paste; typing it key by key would have
// the editor indent each new line once more).
async function typeInto(page, selector, text) {
  await page.click(selector);
  await page.keyboard.press("Control+A");
  await page.keyboard.press("Delete");
  await page.evaluate(
    ({ selector, text }) => {
      const data = new DataTransfer();
      data.setData("text/plain", text);
      const paste = new ClipboardEvent("paste", {
        clipboardData: data,
        bubbles: true,
        cancelable: true,
      });
      document.querySelector(selector).dispatchEvent(paste);
    },
    { selector, text },
  );
}
