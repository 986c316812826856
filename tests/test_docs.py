"""The docs: figures regenerate on a CPU, and the numbers the pages quote are current.

``python -m docs.figures --fast`` draws sections 1 to 3 into a temporary folder; its PNGs must
be valid and its numbers must equal the committed ``docs/figures/numbers.json``, whose
values must in turn be what the pages show (``docs/markers.py`` explains the markers).
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]

from docs.markers import (  # noqa: E402
    blocks_in,
    code_spans,
    fmt,
    markdown_in,
    numbers_in,
    refresh,
)

DOCS = ROOT / "docs"
FIGURES = DOCS / "figures"
PAGES = sorted(DOCS.glob("*.md"))
FAST_FIGURES = ("order-bits.png", "tiles-causal.png", "gantt-full.png", "gantt-causal.png",
                "grid-full.png", "grid-causal.png", "dag-critical-path.png", "lemma.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def committed_numbers() -> dict:
    return json.loads((FIGURES / "numbers.json").read_text())


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)):
        return b == pytest.approx(a, rel=1e-12)
    return a == b


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG; raises AssertionError unless every chunk is intact."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name}: not a PNG"
    pos, kinds, size = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in {kind!r}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        kinds.append(kind)
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds, path.name
    assert size and size[0] > 100 and size[1] > 100, f"{path.name}: {size}"
    return size


def test_fast_figures_command_writes_valid_pngs_and_current_numbers(tmp_path):
    from docs.figures import main

    pages_before = {p: p.read_text() for p in PAGES}
    assert main(["--out", str(tmp_path), "--fast"]) == 0
    for name in FAST_FIGURES:
        png_size(tmp_path / name)
    # the cheap numbers, recomputed, equal what is committed (and quoted in the pages)
    fresh = json.loads((tmp_path / "numbers.json").read_text())
    committed = committed_numbers()
    assert len(fresh) > 100
    stale = {k: (v, committed.get(k)) for k, v in fresh.items() if not same(v, committed.get(k))}
    assert not stale, f"docs/figures/numbers.json is stale, run python -m docs.figures: {stale}"
    for generated in [*tmp_path.glob("*.txt"), *tmp_path.glob("*.md")]:
        assert generated.read_text() == (FIGURES / generated.name).read_text(), (
            f"docs/figures/{generated.name} is stale, run python -m docs.figures")
    # writing elsewhere leaves the pages alone
    assert {p: p.read_text() for p in PAGES} == pages_before


def test_committed_figures_are_valid_pngs():
    pngs = sorted(FIGURES.glob("*.png"))
    assert {p.name for p in pngs} >= set(FAST_FIGURES) | {
        "bits-heatmap.png", "bits-vs-naive.png", "errors.png"}
    for p in pngs:
        png_size(p)


def test_every_generated_number_in_the_pages_matches_numbers_json():
    numbers = committed_numbers()
    seen = 0
    for page in PAGES:
        for key, spec, shown in numbers_in(page.read_text()):
            seen += 1
            assert key in numbers, f"{page.name}: {key} is not in numbers.json"
            assert shown == fmt(numbers[key], spec), (
                f"{page.name}: {key} shows {shown!r}, numbers.json gives "
                f"{fmt(numbers[key], spec)!r}; run python -m docs.figures")
    assert seen > 150


def test_every_transcript_in_the_pages_matches_its_file():
    seen = 0
    for page in PAGES:
        for name, body in blocks_in(page.read_text()):
            seen += 1
            path = FIGURES / f"{name}.txt"
            assert path.exists(), f"{page.name}: no figures/{name}.txt"
            assert body == path.read_text().rstrip("\n"), f"{page.name}: {name} is stale"
    assert seen >= 8


def test_every_generated_table_in_the_pages_matches_its_file():
    seen = 0
    for page in PAGES:
        for name, body in markdown_in(page.read_text()):
            seen += 1
            path = FIGURES / f"{name}.md"
            assert path.exists(), f"{page.name}: no figures/{name}.md"
            assert body == path.read_text(), f"{page.name}: {name} is stale"
    assert seen >= 1


def test_the_contract_table_covers_every_step_in_every_backend():
    from dash_cuda.backends import BACKENDS
    from dash_ref.arithmetic.steps import STEPS
    from docs.contract import contracts

    tables = contracts()
    assert set(tables) == set(BACKENDS)
    every_call = {name for name, s in STEPS.items() if s.feature is None}
    for backend, contract in tables.items():
        # every step of every call; an optional feature's steps (softcap, sinks: no kernel
        # computes them yet) once a backend does
        assert every_call <= set(contract) <= set(STEPS), backend
        assert all(i.same or (i.fast and i.exact) for i in contract.values()), backend


def test_every_step_of_a_reproducible_default_names_the_cpu_functions_that_exist():
    """Where a backend's default arithmetic is reproduced (CuTe: FAST), every contract step
    names the dash_ref functions that reproduce it, and each name resolves."""
    import importlib

    from dash_cuda.backends import get_backend
    from docs.contract import contracts

    for backend, contract in contracts().items():
        if get_backend(backend).default_arithmetic is None:
            assert not any(i.cpu for i in contract.values()), backend
            continue
        for step, instruction in contract.items():
            assert instruction.cpu, f"{backend}: {step} names no CPU function"
            names = re.findall(r"`(steps|mufu|tensorcore|numerics|emulate)\.(\w+)`",
                               instruction.cpu)
            assert names or "fp32" in instruction.cpu, f"{backend}: {step}"
            for name in names:
                module = importlib.import_module(
                    f"dash_ref.{'emulate' if name[0] == 'emulate' else 'arithmetic.' + name[0]}")
                assert hasattr(module, name[1]), f"{backend}: {step}: {'.'.join(name)}"


def test_markers_are_rendered_hidden():
    """A marker starting a line is an HTML block (shown raw); one in code is shown literally."""
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"^ {0,3}<!--n:", text, re.M), page.name
        inline = [s for s in code_spans(text) if s not in code_spans(text, inline=False)]
        for m in re.finditer(r"<!--n:", text):
            assert not any(a <= m.start() < b for a, b in inline), (
                f"{page.name}: a marker inside inline code near {text[m.start():m.start() + 40]}")


def test_refresh_rewrites_numbers_and_blocks_but_not_code():
    text = ("| a | <!--n:x.y:.2f-->0<!--/n--> |\n`<!--n:x.y-->0<!--/n-->`\n"
            "<!--begin:t-->\n```text\nold\n```\n<!--end:t-->\n")
    out = refresh(text, {"x.y": 3.14159}, {"t": "new"})
    assert "<!--n:x.y:.2f-->3.14<!--/n-->" in out
    assert "`<!--n:x.y-->0<!--/n-->`" in out  # inside code: left alone
    assert "```text\nnew\n```" in out and "old" not in out
    assert refresh(out, {"x.y": 3.14159}, {"t": "new"}) == out


def test_relative_links_resolve():
    link = re.compile(r"\]\(([^)\s]+)\)")
    for page in [*PAGES, ROOT / "README.md"]:
        for target in link.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{page.name}: broken link {target}"


def test_readme_links_the_docs_and_shows_a_figure():
    text = (ROOT / "README.md").read_text()
    assert "docs/README.md" in text and "![" in text and "docs/figures/" in text


def test_api_reference_covers_the_public_functions():
    from docs.api import render

    text = render()
    for name in ("dash_ref.Problem", "dash_ref.build_schedule", "dash_ref.emulate.replay",
                 "dash_ref.model.dag.depth_condition", "dash_ref.model.simulator.simulate",
                 "dash_ref.arithmetic.numerics.ulp_distance", "verify.audit.audit",
                 "verify.fuzz.fuzz",
                 "verify.fuzz.check", "verify.strategies.cases", "verify.compare.compare",
                 "verify.highprec.reference_grads"):
        assert f"`{name}`" in text, name
    try:
        import dash_cuda  # noqa: F401
    except Exception:  # noqa: BLE001 - the GPU package may not import everywhere
        assert "`dash_cuda` could not be imported" in text
    else:
        assert "`dash_cuda.attention`" in text
    assert (DOCS / "api.md").exists()


def test_api_md_is_what_its_generator_renders():
    from docs.api import render

    assert (DOCS / "api.md").read_text() == render()


def test_a_full_figures_run_reproduces_every_committed_text_file(tmp_path):
    """What ``python -m docs.figures`` would rewrite, regenerated into a scratch folder:
    ``numbers.json``, every transcript and table, the generated parts of every page, and
    ``api.md`` (the test above) must equal what is committed, so a run leaves
    ``git status`` clean. The PNGs are left out here (their bytes depend on the
    matplotlib build; ``test_committed_figures_are_valid_pngs`` checks them). About 25 s
    on two cores: the emulator under every schedule and the mpmath gradients of
    section 4, and the ``dash-verify`` transcripts of section 5."""
    from docs.figures import generate
    from docs.markers import refresh

    generate(tmp_path, fast=False, pages=False, log=lambda *_: None)
    figures = DOCS / "figures"
    for made in sorted(tmp_path.glob("*.txt")) + sorted(tmp_path.glob("*.md")):
        assert made.read_text() == (figures / made.name).read_text(), made.name
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    assert numbers == json.loads((figures / "numbers.json").read_text())
    texts = {p.stem: p.read_text() for p in tmp_path.glob("*.txt")}
    tables = {p.stem: p.read_text() for p in tmp_path.glob("*.md")}
    for page in sorted(DOCS.glob("*.md")):
        assert refresh(page.read_text(), numbers, texts, tables) == page.read_text(), page.name
