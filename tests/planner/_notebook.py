"""The notebook of seed 001, made runnable against `rlslice.planner`.

The notebook's code is kept in `notebook_cells.txt` beside this file (code only, none of
the Russian prose), so the test that runs it is deterministic and needs nothing outside
the repository. It is a text file, not a module, so that linters and formatters leave the
notebook's code exactly as written. `rewrite()` is the only change made to it; when the
seeds are present, a test checks that the fixture equals `rewrite(seed)`.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "notebook_cells.txt"
REPO = HERE.parent.parent
SEED_DIR = REPO.parent / "shared" / "seeds"

#: (what the notebook says, what the fixture says instead); each occurs exactly once
REWRITES: tuple[tuple[str, str], ...] = (
    ("from IPython.display import display", "display = print  # rewritten: no IPython in tests"),
    ("ROOT = find_repo_root(Path.cwd())", "ROOT = Path.cwd()  # rewritten: no course checkout"),
    ("from module_12_reference import (", "from rlslice.planner import ("),
    ("from module_12_pipeline_sim import (", "from rlslice.planner import ("),
)

_CODE_START = "from __future__ import annotations"


def seed_code(text: str) -> str:
    """The code of the notebook: everything from its first import on."""
    start = text.index(_CODE_START)
    return text[start:].rstrip() + "\n"


def rewrite(code: str) -> str:
    """Point the notebook at rlslice.planner; fail loudly if the notebook changed shape."""
    for old, new in REWRITES:
        count = code.count(old)
        if count != 1:
            raise AssertionError(f"expected {old!r} once in the notebook, found it {count} times")
        code = code.replace(old, new)
    return code


def seed_file() -> Path | None:
    """Seed 001, when ../shared/seeds is beside the repository."""
    found = sorted(SEED_DIR.glob("001_*.txt")) if SEED_DIR.is_dir() else []
    return found[0] if found else None


if __name__ == "__main__":  # regenerate the fixture from the seed
    source = seed_file()
    if source is None:
        raise SystemExit(f"no seed 001 under {SEED_DIR}")
    FIXTURE.write_text(rewrite(seed_code(source.read_text(encoding="utf-8"))), encoding="utf-8")
    print(f"wrote {FIXTURE}")
