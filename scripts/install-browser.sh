#!/usr/bin/env bash
# Installs the browser that tests/test_explore_browser.py drives: Debian's
# `chromium` package (it works offline; Playwright drives it through its
# executable path, so `playwright install` and its download are never needed).
#
# Never fails the setup: where chromium cannot be installed (not root, no
# apt-get), it says why and exits 0; the browser tests then skip with a message.
set -uo pipefail

# The browser tests read the same variable.
CHROMIUM=${SCHEDSPEC_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
  echo "install-browser.sh: $CHROMIUM is already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser.sh: no apt-get on this machine; install Chromium yourself and set SCHEDSPEC_CHROMIUM=/path/to/chromium to run the browser tests (they skip without it)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-browser.sh: not running as root, so not installing Debian's chromium; run 'sudo apt-get install chromium' to enable the browser tests (they skip without it)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp "${TMPDIR:-/tmp}/install-browser.XXXXXX.log")
if ! apt-get install -y -q --no-install-recommends chromium >"$log" 2>&1; then
  # The package lists may be missing or stale on a fresh machine.
  apt-get update -q >>"$log" 2>&1
  if ! apt-get install -y -q --no-install-recommends chromium >>"$log" 2>&1; then
    echo "install-browser.sh: apt-get could not install chromium (log: $log); the browser tests will skip"
    exit 0
  fi
fi
rm -f "$log"
if [ -x "$CHROMIUM" ]; then
  echo "install-browser.sh: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
else
  echo "install-browser.sh: apt-get finished but $CHROMIUM is missing; the browser tests will skip"
fi
exit 0
