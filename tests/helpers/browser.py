"""Open a page in a real headless Chromium and record every network request it makes.

Chromium is pointed at a proxy of ours on the loopback interface (`--proxy-bypass-list=<-loopback>`
sends even loopback traffic through it), so any request the page makes, to any host, is seen
and refused here; nothing leaves the machine. `--dump-dom` gives the DOM after load.
"""

from __future__ import annotations

import os
import shutil
import socketserver
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-extensions",
                  "--disable-default-apps", "--mute-audio"]

# Chromium leaves singleton socket folders in its temporary folder, one per launch, when it is
# ended rather than closed: `chromium_env` keeps that folder inside its profile.


def chromium_env(profile: str) -> dict:
    """The environment a Chromium of the tests runs in: its temporary folder inside `profile`,
    so that what it leaves there goes when the profile is removed."""
    tmp = os.path.join(profile, "tmp")
    os.makedirs(tmp, exist_ok=True)
    return {**os.environ, "TMPDIR": tmp}


def split_text_js(scope: str | None, skip: str, pattern: str) -> str:
    """A JavaScript function of a root element: the pieces of text matching `pattern` (a JS
    regex literal with /g) that run across a line break, in the text under `scope` (a
    selector inside the root; None: all of it), leaving out text inside `skip`."""
    scopes = f"Array.from(root.querySelectorAll({scope!r}))" if scope else "[root]"
    return f"""((root) => {{
  const out = [];
  for (const scope of {scopes}) {{
    const walker = document.createTreeWalker(scope, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {{
      if (node.parentElement.closest({skip!r})) continue;
      const re = {pattern};
      for (let m = re.exec(node.data); m; m = re.exec(node.data)) {{
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0)
                                                         .map(r => Math.round(r.top)));
        if (tops.size > 1) out.push(m[0]);
      }}
    }}
  }}
  return out;
}})"""


# The text pieces of a root's table cells that run across a line break where none may. A piece
# lies between spaces, or ends after a dot or a slash (where a name may wrap); code in
# <pre>/<code> keeps its own lines and is left out.
SPLIT_PIECES = split_text_js("td, th", "pre, code", r"/[^\s.\/]+[.\/]?/g")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str]

    def _refuse(self):
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(403)
        self.end_headers()

    do_GET = do_POST = do_HEAD = do_CONNECT = do_OPTIONS = _refuse

    def log_message(self, *args):  # quiet
        pass


def _host(request: str) -> str:
    target = request.split(" ", 1)[1]
    return target.split("//", 1)[-1].split("/", 1)[0].split(":", 1)[0]


_BROWSER_HOSTS: set[str] | None = None


# Hosts of Google's own services that Chromium calls for itself (sign-in, updates, safe
# browsing), at moments that vary from launch to launch: Chromium 156 called accounts.google.com
# while loading a report but not while loading about:blank just before. No page of ours names
# them (fonts.googleapis.com and the like, which a page could load, are not among them).
CHROMIUM_SERVICES = {"accounts.google.com", "clients2.google.com", "update.googleapis.com",
                     "safebrowsing.googleapis.com", "optimizationguide-pa.googleapis.com",
                     "content-autofill.googleapis.com"}


def browser_own_hosts() -> set[str]:
    """Hosts Chromium itself calls (component updater, clock, accounts) even for about:blank,
    and its services' hosts (`CHROMIUM_SERVICES`)."""
    global _BROWSER_HOSTS
    if _BROWSER_HOSTS is None:
        _BROWSER_HOSTS = {_host(r) for r in _load("about:blank")[1]} | CHROMIUM_SERVICES
    return _BROWSER_HOSTS


def open_page(url: str, *, screenshot: str | None = None,
              timeout: float = 60) -> tuple[str, list[str]]:
    """Load `url`; return (DOM after load, requests the page made).

    Requests to the hosts Chromium contacts for itself on a blank page are not the page's and
    are left out; every other request, to any host, is the page's.
    """
    own = browser_own_hosts()
    dom, seen = _load(url, screenshot=screenshot, timeout=timeout)
    return dom, [r for r in seen if _host(r) not in own]


def _load(url: str, *, screenshot: str | None = None,
          timeout: float = 60) -> tuple[str, list[str]]:
    seen: list[str] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as proxy:
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        port = proxy.server_address[1]
        with tempfile.TemporaryDirectory() as profile:
            cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                   f"--proxy-server=http://127.0.0.1:{port}", "--proxy-bypass-list=<-loopback>",
                   "--virtual-time-budget=5000", "--window-size=1300,1600"]
            env = chromium_env(profile)
            if screenshot:
                subprocess.run([*cmd, f"--screenshot={screenshot}", url], capture_output=True,
                               timeout=timeout, check=False, env=env)
            done = subprocess.run([*cmd, "--dump-dom", url], capture_output=True, text=True,
                                  timeout=timeout, check=False, env=env)
        proxy.shutdown()
    return done.stdout, seen
