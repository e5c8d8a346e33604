"""`asker_holds`: inside a witness's look, the descriptors the *asking* process holds on a file.

The asker is found from its TCP connection (/proc/net/tcp, then /proc/*/fd). Each process
here holds a different number of descriptors on the same file, so a look that found the wrong
process (another asker, the judge itself) would count wrong.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from labkit.judge.witness import Witness, asker_holds

ASK = textwrap.dedent("""
    import sys
    from labkit.probe import see
    held = [open(sys.argv[2]) for _ in range(int(sys.argv[3]))]
    print(see(sys.argv[1], "case", "raised", n=len(held)))
""")


def test_each_asker_is_counted_as_itself(tmp_path):
    path = tmp_path / "store.db"
    path.write_bytes(b"")
    mine = open(path)  # the judge's own descriptor on it: never the asker's
    try:
        with Witness(lambda case, point, said: ({"held": asker_holds(path)}, {})) as witness:
            for _warm_up in range(50):  # connections the table keeps in TIME_WAIT, as in a long run
                subprocess.run([sys.executable, "-c", ASK, witness.url, str(path), "0"], check=True,
                               capture_output=True, timeout=60)
            counts = [3, 1, 0, 2]
            procs = [subprocess.Popen([sys.executable, "-c", ASK, witness.url, str(path), str(n)],
                                      stdout=subprocess.PIPE, text=True) for n in counts]
            for proc in procs:
                proc.communicate(timeout=60)
            seen = [(s.said["n"], s.saw["held"]) for s in witness.sightings()[-len(counts):]]
    finally:
        mine.close()
    assert sorted(seen) == [(n, n) for n in sorted(counts)]
