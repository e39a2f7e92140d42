"""nbformat, imported without the grammar that its schema validator builds and never uses.

nbformat validates with jsonschema, and importing jsonschema builds `rfc3987_syntax`'s IRI
grammar when that package is installed (2.1 s of a 6.6 s `python _build_nb.py --help` here).
The grammar only serves jsonschema's `"format": "iri"` check, which no nbformat schema asks for
(their `"format"` keys name a raw cell's format) and nbformat's validator does not enable. So the
package is hidden for this one import, and visible again after it: whoever imports it later gets
it. Import nbformat from here, before anything that imports it (jupytext, nbclient).
"""

import sys

_HIDDEN = "rfc3987_syntax"
_hide = _HIDDEN not in sys.modules
if _hide:
    sys.modules[_HIDDEN] = None  # an import of it raises ImportError, which jsonschema expects
try:
    import nbformat
finally:
    if _hide:
        del sys.modules[_HIDDEN]

__all__ = ["nbformat"]
