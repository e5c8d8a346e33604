"""Every wrong solution's patch still applies to its lab's reference, and the applier is strict.

A wrong solution is the reference with one mistake, stored as a patch
(`tests/wrong_solutions/<lab>/<name>.patch`) beside a data file of what each mistake promises
(`<lab>.toml`; `labkit.judge.catalogue`). When the reference changes under a patch, the patch
must fail here, by name, instead of quietly testing another mistake.
"""

from __future__ import annotations

import pytest
import toylab
from catalogue import add, labs_with_wrong_solutions, wrong_file

from labkit.judge import catalogue, coverage

LABS = labs_with_wrong_solutions()
ENTRIES = [(lab, entry) for lab in LABS for entry in catalogue.read(coverage.CATALOGUE, lab).entries]

REFERENCE = "".join(f"line {n}\n" for n in range(1, 21))
CHANGED = REFERENCE.replace("line 5\n", "line five\n").replace("line 15\n", "line 15\nline 15b\n")
PATCH = """\
--- a/solutions/toy.py
+++ b/solutions/toy.py
@@ -2,7 +2,7 @@
 line 2
 line 3
 line 4
-line 5
+line five
 line 6
 line 7
 line 8
@@ -13,6 +13,7 @@
 line 13
 line 14
 line 15
+line 15b
 line 16
 line 17
 line 18
"""


def test_every_course_lab_has_a_catalogue():
    assert {"outbox", "vending", "relay"} <= set(LABS)


@pytest.mark.parametrize(("lab", "entry"), ENTRIES, ids=[f"{lab}:{entry.name}" for lab, entry in ENTRIES])
def test_a_wrong_solutions_patch_applies_to_the_reference(lab, entry):
    wrong = catalogue.read(coverage.CATALOGUE, lab)
    reference = coverage.reference(lab).read_text()
    try:
        body = wrong.body(entry, reference)
    except catalogue.PatchError as error:
        pytest.fail(f"{wrong.patch_path(entry.name)} no longer applies to {coverage.reference(lab).name}: "
                    f"make the mistake again in a fresh copy and `python tests/catalogue.py add`\n{error}")
    assert body != reference, f"{entry.name}.patch changes nothing"


@pytest.mark.parametrize("lab", LABS)
def test_every_entry_has_a_patch_and_every_patch_an_entry(lab):
    wrong = catalogue.read(coverage.CATALOGUE, lab)
    names = [entry.name for entry in wrong.entries]
    patches = {path.stem for path in (coverage.CATALOGUE / lab).glob("*.patch")}
    assert names == sorted(set(names)), f"{lab}.toml: names are not sorted, or one is there twice"
    assert sorted(set(names) - patches) == [], f"entries of {lab}.toml without a patch in {lab}/"
    assert sorted(patches - set(names)) == [], f"patches in {lab}/ without an entry in {lab}.toml"
    assert sorted(p.name for p in (coverage.CATALOGUE / lab).iterdir() if p.suffix != ".patch") == []


@pytest.mark.parametrize("lab", LABS)
def test_the_data_file_is_what_dumps_writes(lab):
    """So `python tests/catalogue.py add` rewriting it changes only the entry it adds."""
    wrong = catalogue.read(coverage.CATALOGUE, lab)
    assert catalogue.data_file(coverage.CATALOGUE, lab).read_text() == catalogue.dumps(wrong)


def test_the_applier_reproduces_a_known_patch_exactly():
    assert catalogue.make_patch(REFERENCE, CHANGED, "solutions/toy.py") == PATCH
    assert catalogue.apply(PATCH, REFERENCE) == CHANGED


@pytest.mark.parametrize(("edit", "said"), [
    (lambda text: text.replace("line 4\n", "line 4 \n"), "hunk 1 (@@ -2,7 +2,7 @@) does not apply"),
    (lambda text: text.replace("line 5\n", "line 5.0\n"), "hunk 1 (@@ -2,7 +2,7 @@) does not apply"),
    (lambda text: text.replace("line 16\n", "line sixteen\n"), "hunk 2 (@@ -13,6 +13,7 @@) does not apply"),
    (lambda text: "line 0\n" + text, "hunk 1 (@@ -2,7 +2,7 @@) does not apply"),  # moved: no offset search
], ids=["context changed", "removed line changed", "second hunk's context", "lines moved"])
def test_the_applier_refuses_a_patch_whose_lines_changed(tmp_path, edit, said):
    patch = tmp_path / "toy" / "mistake.patch"
    patch.parent.mkdir()
    patch.write_text(PATCH)
    with pytest.raises(catalogue.PatchError) as caught:
        catalogue.apply(patch.read_text(), edit(REFERENCE), str(patch))
    assert str(caught.value).startswith(f"{patch}: {said}"), caught.value


def test_the_applier_refuses_hunks_out_of_order_and_cut_short():
    head, rest = PATCH.split("@@ -2", 1)
    first, second = rest.split("@@ -13", 1)
    swapped = head + "@@ -13" + second + "@@ -2" + first
    with pytest.raises(catalogue.PatchError, match="hunk 2 .* starts before hunk 1 ends"):
        catalogue.apply(swapped, REFERENCE)
    with pytest.raises(catalogue.PatchError, match="hunk 2 .* is cut short"):
        catalogue.apply(PATCH.rsplit(" line 18\n", 1)[0], REFERENCE)
    with pytest.raises(catalogue.PatchError, match="not a unified diff"):
        catalogue.apply("line five\n", REFERENCE)


def test_a_source_is_the_docstring_then_the_patched_reference(tmp_path):
    entry = catalogue.Wrong("mistake", "1", "1.type", "says five", "five")
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "mistake.patch").write_text(PATCH)
    docstring = '"""Wrong: says five. Fails step 1. Clause: 1.type. Message: five"""\n'
    assert catalogue.Catalogue(tmp_path, "toy", [entry]).source(entry, REFERENCE) == docstring + "\n" + CHANGED
    assert catalogue.Catalogue(tmp_path, "toy", [entry], blank_line=False).source(entry, REFERENCE) == docstring + CHANGED
    assert catalogue.parse("mistake", docstring + "\n" + CHANGED) == (entry, "\n" + CHANGED)


def test_add_turns_an_edited_copy_into_a_patch_and_an_entry(monkeypatch, tmp_path):
    folder = toylab.install(monkeypatch, tmp_path / "course")
    copy = tmp_path / "eleven_accepted.py"
    copy.write_text('"""Wrong: accepts 11. Fails step 1. Clause: 1.range. Message: 0 to 10"""\n\n'
                    + toylab.REFERENCE.replace("0 <= n <= 10", "0 <= n <= 11"))
    patch = add("toy", copy)
    assert patch == folder / "toy" / "eleven_accepted.patch"
    assert catalogue.read(folder, "toy").entries == [catalogue.Wrong("eleven_accepted", "1", "1.range", "accepts 11",
                                                                     "0 to 10")]
    # the toy's catalogue has no blank line after the docstring: the built file follows the lab
    assert wrong_file("toy", "eleven_accepted").read_text() == copy.read_text().replace('"""\n\n', '"""\n')
    copy.write_text(copy.read_text().replace("0 <= n <= 11", "0 <= n <= 10"))
    with pytest.raises(ValueError, match="the reference unchanged"):
        add("toy", copy)
