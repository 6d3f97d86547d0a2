// The playground and the dashboard in headless Chromium: an answer streamed over SSE and over
// the WebSocket survives a connection broken mid-answer and ends whole, exactly once; the
// dashboard shows the routes and its rotation panels; with [auth] the page is refused without a key and streams and
// resumes with one typed in. Starts its own tailcut (tests/browser/browser.toml: a slow,
// long, deterministic answer; a copy with [auth] and a fresh key) on free loopback ports and
// saves screenshots and server logs under target/browser/.
//
//   node tests/browser/resume.mjs            (after `cargo build --bins`)
//   TAILCUT_BIN=path/to/tailcut node tests/browser/resume.mjs
//
// Uses Debian's /usr/bin/chromium (CHROMIUM overrides it); never downloads a browser.

import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");
const bin = process.env.TAILCUT_BIN ? resolve(process.env.TAILCUT_BIN) : join(root, "target/debug/tailcut");
const shots = join(root, "target/browser");
const PROMPT = "Tell me a long story about tail latency.";
// Break once the answer is this many events in (of about 150), well before its end.
const BREAK_AT_EVENT = 30;
const STEP_MS = 30_000;

mkdirSync(shots, { recursive: true });

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function waitReady(base, server) {
  for (let i = 0; i < 200; i++) {
    if (server.exitCode !== null) throw new Error("tailcut exited with " + server.exitCode);
    try {
      const r = await fetch(base + "/readyz");
      if (r.ok) return;
    } catch {
      /* not listening yet */
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("tailcut did not become ready at " + base);
}

const failures = [];
function check(ok, what) {
  console.log((ok ? "ok   " : "FAIL ") + what);
  if (!ok) failures.push(what);
}

/** The answer the server gives for PROMPT without streaming: what every page must end with. */
async function serverAnswer(base) {
  const r = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: PROMPT }] }),
  });
  if (!r.ok) throw new Error("POST /v1/chat/completions: HTTP " + r.status);
  const body = await r.json();
  return body.choices[0].message.content;
}

/** Sends PROMPT on `transport` from a fresh playground; breaks the connection at
 *  BREAK_AT_EVENT when `breakIt`; types `key` into the token field first when given;
 *  returns what the request's card ends with. */
async function streamOnce(page, base, transport, breakIt, key) {
  const url = base + "/?transport=" + transport + "&hedge=0&prompt=" + encodeURIComponent(PROMPT);
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", { timeout: STEP_MS });
  if (key) {
    await page.fill("#token", key);
    await page.dispatchEvent("#token", "change");
  }
  if (transport === "ws") await page.waitForSelector("#conn.ok", { timeout: STEP_MS });
  await page.click("#send");
  const card = page.locator(".req").first();
  let textAtBreak = null;
  if (breakIt) {
    await page.waitForFunction(
      (n) => {
        const card = document.querySelector(".req");
        return card && (Number(card.dataset.lastSeq || 0) >= n || card.dataset.state !== "open");
      },
      BREAK_AT_EVENT,
      { timeout: STEP_MS },
    );
    if ((await card.getAttribute("data-state")) === "open") {
      textAtBreak = await card.locator(".out").textContent();
      await card.getByRole("button", { name: "Break the connection" }).click();
    }
  }
  const ended = await page
    .waitForFunction(() => document.querySelector(".req")?.dataset.state !== "open", null, { timeout: STEP_MS })
    .then(() => true, () => false);
  if (!ended) {
    console.log(`  ${transport}: the request did not end in ${STEP_MS} ms; its card:`);
    console.log("  " + JSON.stringify(await card.evaluate((c) => ({ data: { ...c.dataset }, conn: document.querySelector("#conn").textContent, notes: [...c.querySelectorAll(".note")].map((n) => n.textContent), text: c.querySelector(".out").textContent.length }))));
  }
  return {
    state: await card.getAttribute("data-state"),
    text: await card.locator(".out").textContent(),
    resumes: Number(await card.getAttribute("data-resumes")),
    anomalies: Number(await card.getAttribute("data-anomalies")),
    notes: await card.locator(".note").allTextContents(),
    textAtBreak,
  };
}

/** Starts tailcut with `config` on a free loopback port; its log goes to target/browser/NAME.log. */
async function startServer(config, name, env) {
  const port = await freePort();
  const base = "http://127.0.0.1:" + port;
  const log = openSync(join(shots, name + ".log"), "w");
  const server = spawn(bin, ["serve", "--config", config, "--listen", "127.0.0.1:" + port], {
    stdio: ["ignore", log, log],
    env: Object.assign({}, process.env, env || {}),
  });
  servers.push(server);
  await waitReady(base, server);
  return base;
}
const servers = [];

/** With [auth]: the page refuses to stream without a credential and streams with a key typed
 *  into its token field, over SSE (bearer on POST /v1/streams) and the WebSocket (the key
 *  traded for a browser token). The key is made here and never printed. */
async function withAuth(browser, expected) {
  const key = "tc_" + randomBytes(24).toString("hex");
  const sha = createHash("sha256").update(key).digest("hex");
  const config = join(shots, "auth.toml");
  const admin = randomBytes(16).toString("hex");
  writeFileSync(
    config,
    readFileSync(join(here, "browser.toml"), "utf8").replace(
      "[server]\n",
      '[server]\nadmin_token_env = "TAILCUT_BROWSER_TEST_ADMIN"\n',
    ) +
      '\n[tenants.browser]\n[auth]\ntoken_secret_env = "TAILCUT_BROWSER_TEST_SECRET"\n' +
      '[[auth.keys]]\nname = "browser-test"\nsha256 = "' + sha + '"\ntenant = "browser"\n',
  );
  const base = await startServer(config, "server-auth", {
    TAILCUT_BROWSER_TEST_SECRET: randomBytes(32).toString("hex"),
    TAILCUT_BROWSER_TEST_ADMIN: admin,
  });
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  const page = await context.newPage();
  page.on("pageerror", (e) => check(false, "auth: no script error in the page: " + e.message));
  const refused = await streamOnce(page, base, "sse", false);
  check(
    refused.state === "error" && refused.notes.some((n) => n.includes("401")),
    `auth: without a key the page is refused with 401 (${refused.state}: ${refused.notes.join(" | ")})`,
  );
  for (const transport of ["sse", "ws"]) {
    const result = await streamOnce(page, base, transport, true, key);
    check(
      result.state === "done" && result.text === expected && result.anomalies === 0 && result.resumes >= 1,
      `auth: with a key typed in, ${transport} streams, resumes and ends whole (${result.state}: ${result.notes.join(" | ")})`,
    );
  }

  // The dashboard with the admin token: the routes show, and a 10 s drill opens a breaker
  // and says how long is left.
  await page.goto(base + "/dashboard");
  await page.fill("#token", admin);
  const row = page.locator("tr[data-route='sim-long-b']");
  await row.waitFor({ timeout: STEP_MS });
  await page.selectOption("#drillMs", "10000");
  await row.getByRole("button", { name: "drill" }).click();
  await page.waitForFunction(
    () => /drill: \d+(\.\d)? s left/.test(document.querySelector("tr[data-route='sim-long-b'] .drilling")?.textContent || ""),
    null,
    { timeout: STEP_MS },
  );
  const drillStatus = await page.locator("#drillStatus").textContent();
  check(/open for 10\.0 s/.test(drillStatus), `auth: the drill says how long it lasts (${drillStatus})`);
  const breaker = await row.locator(".pill").first().textContent();
  check(breaker.startsWith("open"), `auth: the drilled route's breaker shows open (${breaker})`);
  // The rotation panels read /admin/rotation with the same token: every route has its row.
  await page.locator("#routeRows tr[data-rot-route='sim-long-b']").waitFor({ timeout: STEP_MS });
  const rotated = await page.locator("#rotFigures b").count();
  check(rotated >= 6, `auth: the rotation panels show their figures (${rotated})`);
  await page.setViewportSize({ width: 1500, height: 900 });
  await page.screenshot({ path: join(shots, "dashboard-drill.png"), fullPage: true });
  await context.close();
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox"],
  });
  try {
    const base = await startServer(join(here, "browser.toml"), "server");
    const expected = await serverAnswer(base);
    check(expected.length > 200, "the simulated answer is long (" + expected.length + " chars)");
    check((await serverAnswer(base)) === expected, "the simulated upstream is deterministic: the same answer twice");

    const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
    const page = await context.newPage();
    page.on("pageerror", (e) => check(false, "no script error in the page: " + e.message));

    const transports = (process.env.TRANSPORTS || "sse,ws").split(",");
    for (const transport of transports) {
      const plain = await streamOnce(page, base, transport, false);
      check(plain.state === "done", `${transport}: an unbroken stream ends done (was ${plain.state}: ${plain.notes.join(" | ")})`);
      check(plain.text === expected, `${transport}: an unbroken stream shows the server's answer`);
      check(plain.anomalies === 0 && plain.resumes === 0, `${transport}: an unbroken stream has no resume and no anomaly`);

      const broken = await streamOnce(page, base, transport, true);
      await page.screenshot({ path: join(shots, `playground-${transport}.png`), fullPage: true });
      check(broken.state === "done", `${transport}: the broken stream still ends done (was ${broken.state}: ${broken.notes.join(" | ")})`);
      check(
        broken.textAtBreak !== null && broken.textAtBreak.length > 0 && broken.textAtBreak.length < expected.length,
        `${transport}: the break came mid-answer (${(broken.textAtBreak || "").length} of ${expected.length} chars)`,
      );
      check(broken.resumes >= 1, `${transport}: the page resumed (${broken.resumes} resume(s))`);
      check(
        broken.notes.some((n) => /^Resumed after event \d+/.test(n)),
        `${transport}: the page says where it resumed (${broken.notes.filter((n) => n.startsWith("Resumed")).join(" | ")})`,
      );
      check(broken.anomalies === 0, `${transport}: no duplicate and no missing event (${broken.anomalies} flagged)`);
      check(broken.text === expected, `${transport}: the page ends with the whole answer exactly once`);
      if (broken.text !== expected) {
        console.log("  expected " + expected.length + " chars, got " + broken.text.length);
      }
    }

    await page.goto(base + "/dashboard");
    await page.waitForSelector("tr[data-route='sim-long-a']", { timeout: STEP_MS });
    await page.waitForSelector("tr[data-route='sim-long-b']", { timeout: STEP_MS });
    const rows = await page.locator("#rows tr").count();
    check(rows === 2, `the dashboard shows both routes (${rows} rows)`);
    await page.waitForTimeout(1200);
    await page.screenshot({ path: join(shots, "dashboard.png"), fullPage: true });
    await context.close();

    await withAuth(browser, expected);
  } finally {
    await browser.close();
    for (const server of servers) server.kill("SIGTERM");
  }
  console.log("screenshots in " + shots);
  if (failures.length) {
    console.error(failures.length + " check(s) failed");
    process.exit(1);
  }
  console.log("browser test passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
