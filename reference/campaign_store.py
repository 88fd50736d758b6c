"""A campaign's results folder (`schedspec diff --results DIR`, `--resume DIR`).

    DIR/campaign.json   what the campaign is: its options, its scenario files
                        and their sha256 (written once, before any result)
    DIR/results.jsonl   one line per finished scenario, appended as results
                        arrive (any order), flushed line by line
    DIR/report.json     the campaign's report, written when it ends: no
                        timings, so the same campaign gives the same bytes
                        whatever ran it (--workers N, --ray) and however often
                        it was interrupted and resumed

A campaign cut off (Ctrl-C, a killed machine) leaves campaign.json and the
lines it finished; `--resume DIR` reads both, checks that the scenario files
did not change, and runs only the scenarios without a line.  A last line cut
off mid-write is dropped and its scenario run again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .errors import UsageError, shown

CAMPAIGN_FORMAT = "schedspec.campaign/1"
CAMPAIGN_FILE, RESULTS_FILE, REPORT_FILE = "campaign.json", "results.jsonl", "report.json"

#: CampaignOptions fields that define which scenarios run and how they are compared.
DEFINING = ("impl", "against", "seed", "num_scenarios", "flags", "device", "out_dir", "shrink", "shrink_seconds")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def describe_campaign(options, files: list[str]) -> dict[str, Any]:
    """campaign.json's content: the defining options, and the files with their hashes."""
    opts = {k: getattr(options, k) for k in DEFINING}
    opts["out_dir"] = str(opts["out_dir"])
    opts["flags"] = None if opts["flags"] is None else [list(f) for f in opts["flags"]]
    return {"format": CAMPAIGN_FORMAT, "options": opts, "vllm_version": options.release,
            "files": [{"path": str(Path(f).resolve()), "sha256": sha256_of(Path(f))} for f in files]}


def options_from_campaign(data: dict[str, Any], base):
    """`base` (a CampaignOptions) with the defining options `data` recorded."""
    opts = dict(data["options"])
    opts["out_dir"] = Path(opts["out_dir"])
    opts["flags"] = None if opts["flags"] is None else tuple(tuple(bool(x) for x in f) for f in opts["flags"])
    return dataclasses.replace(base, **opts)


class ResultStore:
    """DIR's files: `start` a new campaign or `resume` one, `append` results, `finish` with the report."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self._out = None

    @property
    def results_path(self) -> Path:
        return self.dir / RESULTS_FILE

    def start(self, campaign: dict[str, Any]) -> None:
        """A new campaign in DIR; DIR must be new or empty, so no earlier results are mixed in or lost."""
        if self.dir.exists() and (not self.dir.is_dir() or any(self.dir.iterdir())):
            what = "is not a folder" if not self.dir.is_dir() else "is not empty"
            raise UsageError(f"--results {shown(self.dir)}: {what}; give a new folder "
                             f"(or continue the campaign there with --resume {shown(self.dir)})")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / CAMPAIGN_FILE).write_text(json.dumps(campaign, indent=1) + "\n")
        except OSError as e:
            raise UsageError(f"--results {shown(self.dir)}: cannot write: {e.strerror or e}") from None
        self._open()

    def read_campaign(self) -> dict[str, Any]:
        """DIR's campaign.json, checked; a UsageError naming what is wrong."""
        path = self.dir / CAMPAIGN_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UsageError(f"--resume {shown(self.dir)}: no {CAMPAIGN_FILE} there; it is not a campaign's "
                             "results folder (start one with --results DIR)") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--resume {shown(self.dir)}: cannot read {CAMPAIGN_FILE}: {shown(e, 120)}") from None
        if not isinstance(data, dict) or data.get("format") != CAMPAIGN_FORMAT:
            raise UsageError(f"--resume {shown(self.dir)}: {CAMPAIGN_FILE} is not a {CAMPAIGN_FORMAT} file")
        for f in data.get("files", []):
            p = Path(f["path"])
            if not p.is_file():
                raise UsageError(f"--resume {shown(self.dir)}: the campaign's scenario file {shown(p)} is gone")
            if sha256_of(p) != f["sha256"]:
                raise UsageError(f"--resume {shown(self.dir)}: the campaign's scenario file {shown(p)} changed "
                                 "since the campaign started; start a new campaign")
        return data

    def resume(self) -> dict[int, dict[str, Any]]:
        """The results DIR already holds, by scenario index; later lines win."""
        done: dict[int, dict[str, Any]] = {}
        try:
            lines = self.results_path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        for k, line in enumerate(lines):
            try:
                rec = json.loads(line)
                done[int(rec["index"])] = rec
            except (ValueError, KeyError, TypeError):
                if k == len(lines) - 1:  # cut off mid-write: its scenario runs again
                    continue
                raise UsageError(f"--resume {shown(self.dir)}: {RESULTS_FILE} line {k + 1} is not a result; "
                                 "the folder was edited by hand") from None
        # Rewrite the file whole, so that an ended-mid-line file does not glue onto the next line.
        tmp = self.results_path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for _, r in sorted(done.items())))
        os.replace(tmp, self.results_path)
        self._open()
        return done

    def _open(self) -> None:
        self._out = open(self.results_path, "a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def finish(self, report: dict[str, Any]) -> Path:
        path = self.dir / REPORT_FILE
        path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return path

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


__all__ = ["CAMPAIGN_FORMAT", "DEFINING", "ResultStore", "describe_campaign", "options_from_campaign", "sha256_of"]
