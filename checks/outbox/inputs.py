"""The inputs lab 01's checks try, as data: every kind of every near-miss, every run.

Each table lists *all* the kinds the contract rules out (or lets in) for one rule, so a run
never tries one kind chosen at random: randomness may add inputs, never replace these.
"""

from __future__ import annotations

import string
import unicodedata

LETTERS_DIGITS = string.ascii_letters + string.digits
NAME_REST = LETTERS_DIGITS + "._-"
# ASCII punctuation the grammar refuses after the first character (".", "_", "-" are allowed).
PUNCTUATION = [c for c in string.punctuation if c not in "._-"]
# Whitespace and control characters: what str.strip()/split()/isspace() know, plus NUL and DEL.
SPACES = [" ", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680",
          "\u2000", "\u2028", "\u2029", "\u3000", "\x00", "\x7f"]
# Letters and digits of other scripts that isalnum()/isdigit()/\w/\d accept, and the two
# letters re.IGNORECASE folds onto ASCII ([a-z] with re.I matches the Kelvin sign and long s).
NON_ASCII = ["é", "ß", "٧", "Ａ", "²", "\u212a", "\u017f", "\u0131"]
NON_ASCII_SHOWN = "é, ß, ٧, Ａ, ², K (the Kelvin sign), ſ (long s) and ı (dotless i)"
# Text int() turns into a number although it is not the digits of one.
INT_LOOKALIKES = ["5", " 7", "+7", "7_0", "٧", "7\n"]


def char_name(c: str) -> str:
    """A character as a student can read it in a message: 'U+0085 NEXT LINE (NEL)'."""
    if c in PUNCTUATION or c in LETTERS_DIGITS:
        return repr(c)
    name = unicodedata.name(c, "")
    if not name:
        name = {"\x00": "NUL", "\x7f": "DELETE", "\x85": "NEXT LINE", "\t": "TAB", "\r": "CARRIAGE RETURN",
                "\n": "LINE FEED", "\x0b": "LINE TABULATION", "\x0c": "FORM FEED", "\x1c": "FILE SEPARATOR",
                "\x1d": "GROUP SEPARATOR", "\x1e": "RECORD SEPARATOR", "\x1f": "UNIT SEPARATOR"}.get(c, "")
    return f"U+{ord(c):04X} {name}".rstrip()


# --- step 8: URLs ---------------------------------------------------------------------------
# Each entry: (label, url template, clause). "{p}" is a port where a judge's listener waits, so
# a URL that should have been refused but was used shows up as a connection.

URL_REFUSED = [
    ("https", "https://127.0.0.1:{p}/events", "8.url-scheme"),
    ("HTTP in capitals", "HTTP://127.0.0.1:{p}/events", "8.url-scheme"),
    ("Http", "Http://127.0.0.1:{p}/events", "8.url-scheme"),
    ("ftp", "ftp://127.0.0.1:{p}/events", "8.url-scheme"),
    ("no scheme", "127.0.0.1:{p}/events", "8.url-scheme"),
    ("LOCALHOST", "http://LOCALHOST:{p}/events", "8.url-host-localhost"),
    ("localhost with a final dot", "http://localhost.:{p}/events", "8.url-host-localhost"),
    ("localhost.evil", "http://localhost.evil:{p}/events", "8.url-host-localhost"),
    ("localhos", "http://localhos:{p}/events", "8.url-host-localhost"),
    ("0.0.0.0", "http://0.0.0.0:{p}/events", "8.url-host-other"),
    ("128.0.0.1", "http://128.0.0.1:{p}/events", "8.url-host-other"),
    ("126.255.255.255", "http://126.255.255.255:{p}/events", "8.url-host-other"),
    ("10.0.0.1", "http://10.0.0.1:{p}/events", "8.url-host-other"),
    ("::1 in brackets", "http://[::1]:{p}/events", "8.url-host-other"),
    ("::ffff:127.0.0.1 in brackets", "http://[::ffff:127.0.0.1]:{p}/events", "8.url-host-other"),
    ("a remote name", "http://example.invalid:{p}/events", "8.url-host-other"),
    ("no host", "http://:{p}/events", "8.url-host-other"),
    ("127.1", "http://127.1:{p}/events", "8.url-host-spelling"),
    ("0x7f.0.0.1", "http://0x7f.0.0.1:{p}/events", "8.url-host-spelling"),
    ("2130706433", "http://2130706433:{p}/events", "8.url-host-spelling"),
    ("127.0.0.1 with a final dot", "http://127.0.0.1.:{p}/events", "8.url-host-spelling"),
    ("127.0.0.01", "http://127.0.0.01:{p}/events", "8.url-host-spelling"),
    ("127.0.0.1.5", "http://127.0.0.1.5:{p}/events", "8.url-host-spelling"),
    ("127.0.0.256", "http://127.0.0.256:{p}/events", "8.url-host-spelling"),
    ("no port", "http://127.0.0.1/events", "8.url-port"),
    ("an empty port after localhost", "http://localhost:/events", "8.url-port"),
    ("port 0", "http://127.0.0.1:0/events", "8.url-port"),
    ("port 65536", "http://127.0.0.1:65536/events", "8.url-port"),
    ("port +80", "http://127.0.0.1:+{p}/events", "8.url-port"),
    ("port with a space", "http://127.0.0.1: {p}/events", "8.url-port"),
    ("port -1", "http://127.0.0.1:-1/events", "8.url-port"),
    ("port in Arabic-Indic digits", "http://127.0.0.1:٨٠/events", "8.url-port"),
    ("port in full-width digits", "http://127.0.0.1:８０/events", "8.url-port"),
    ("path /events/", "http://127.0.0.1:{p}/events/", "8.url-path"),
    ("path /Events", "http://127.0.0.1:{p}/Events", "8.url-path"),
    ("path //events", "http://127.0.0.1:{p}//events", "8.url-path"),
    ("path /events;x", "http://127.0.0.1:{p}/events;x", "8.url-path"),
    ("path /events%2f", "http://127.0.0.1:{p}/events%2f", "8.url-path"),
    ("path /%65vents", "http://127.0.0.1:{p}/%65vents", "8.url-path"),
    ("path /orders", "http://127.0.0.1:{p}/orders", "8.url-path"),
    ("path /events/x", "http://127.0.0.1:{p}/events/x", "8.url-path"),
    ("no path", "http://127.0.0.1:{p}", "8.url-path"),
    ("path /", "http://127.0.0.1:{p}/", "8.url-path"),
    ("user info", "http://admin@127.0.0.1:{p}/events", "8.url-userinfo"),
    ("empty user info", "http://@127.0.0.1:{p}/events", "8.url-userinfo"),
    ("user info ':'", "http://:@127.0.0.1:{p}/events", "8.url-userinfo"),
    ("user and password", "http://user:pw@127.0.0.1:{p}/events", "8.url-userinfo"),
    ("a query", "http://127.0.0.1:{p}/events?x=1", "8.url-query"),
    ("an empty query", "http://127.0.0.1:{p}/events?", "8.url-query"),
    ("a fragment", "http://127.0.0.1:{p}/events#top", "8.url-fragment"),
    ("an empty fragment", "http://127.0.0.1:{p}/events#", "8.url-fragment"),
    ("a leading space", " http://127.0.0.1:{p}/events", "8.url-whitespace"),
    ("a trailing space", "http://127.0.0.1:{p}/events ", "8.url-whitespace"),
    ("a final newline", "http://127.0.0.1:{p}/events\n", "8.url-whitespace"),
    ("a tab inside the path", "http://127.0.0.1:{p}/ev\tents", "8.url-whitespace"),
    ("a newline inside the host", "http://127.0.\n0.1:{p}/events", "8.url-whitespace"),
    ("a carriage return inside", "http://127.0.0.1:{p}/events\r", "8.url-whitespace"),
    ("a leading NUL", "\x00http://127.0.0.1:{p}/events", "8.url-whitespace"),
]

# --- step 8: replies ------------------------------------------------------------------------

REDIRECTS = [301, 302, 303, 307, 308]
OTHER_STATUSES = [201, 202, 203, 204, 300, 304, 400, 404, 409, 500, 503]
NOT_OBJECTS = [b"true", b"null", b"NaN", b"Infinity", b"7", b"[]"]  # plus the id as a string and a list
NOT_JSON = [b"ok", b"", b"{", b"\xff\xfe{}", b"<html>ack</html>"]
