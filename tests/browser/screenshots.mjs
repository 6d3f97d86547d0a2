// Regenerates the README's screenshots (docs/img/) from the embedded default config: warms
// the routes with some traffic so the dashboard has TTFT tails to plot, then shows a
// playground answer that survived a broken connection, and the dashboard (its route table, and
// its rotation panels).
//
//   cargo build --bins && node tests/browser/screenshots.mjs
//
// Uses Debian's /usr/bin/chromium (CHROMIUM overrides it); never downloads a browser.

import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");
const bin = process.env.TAILCUT_BIN ? resolve(process.env.TAILCUT_BIN) : join(root, "target/debug/tailcut");
const out = join(root, "docs/img");
mkdirSync(out, { recursive: true });

const port = await new Promise((ok) => {
  const s = createServer();
  s.listen(0, "127.0.0.1", () => {
    const { port } = s.address();
    s.close(() => ok(port));
  });
});
const base = "http://127.0.0.1:" + port;
const server = spawn(bin, ["serve", "--listen", "127.0.0.1:" + port], { stdio: "ignore" });
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox"],
});
try {
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(base + "/readyz")).ok) break;
    } catch {
      /* not up yet */
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  // Traffic: 160 answers, 16 at a time, so every route has a window of first tokens.
  const one = () =>
    fetch(base + "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "Warm-up." }] }),
    }).then((r) => r.text());
  for (let round = 0; round < 10; round++) await Promise.all(Array.from({ length: 16 }, one));

  const page = await browser.newPage({ viewport: { width: 1200, height: 760 } });
  for (const transport of ["sse", "ws"]) {
    await page.goto(base + "/?transport=" + transport);
    await page.waitForSelector("body[data-ready='1']");
    if (transport === "ws") await page.waitForSelector("#conn.ok");
    await page.click("#send");
    await page.waitForFunction(() => {
      const card = document.querySelector(".req");
      return card && (Number(card.dataset.lastSeq) >= 12 || card.dataset.state !== "open");
    });
    const card = page.locator(".req").first();
    if ((await card.getAttribute("data-state")) === "open") {
      await card.getByRole("button", { name: "Break the connection" }).click();
    }
    await page.waitForFunction(() => document.querySelector(".req").dataset.state !== "open", null, { timeout: 60_000 });
    await page.screenshot({ path: join(out, `playground-${transport}.png`) });
  }
  await page.setViewportSize({ width: 1500, height: 820 });
  await page.goto(base + "/dashboard");
  await page.waitForSelector("#ccdfLegend span");
  await page.waitForTimeout(1500);
  await page.screenshot({ path: join(out, "dashboard.png") });
  await page.waitForSelector("#routeRows tr[data-rot-route]");
  await page.locator("h2.section").scrollIntoViewIfNeeded();
  await page.evaluate(() => document.querySelector("h2.section").scrollIntoView({ block: "start" }));
  await page.screenshot({ path: join(out, "dashboard-rotation.png") });
  console.log("screenshots in " + out);
} finally {
  await browser.close();
  server.kill("SIGTERM");
}
