# --- provided code -----------------------------------------------
"""The warm-up module: written by the step cells of 00-start-here."""


# --- step 1 ------------------------------------------------------
def normalize_sku(s):
    """'  Dark   Chocolate ' -> 'dark-chocolate'; not a str, or blank -> ValueError."""
    if type(s) is not str or not s.strip():
        raise ValueError(f"a SKU is a non-blank str, not {s!r}")
    return "-".join(s.split()).lower()
