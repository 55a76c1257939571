"""The HTML document around the sections: inline CSS for screen and print, no external resources."""

from __future__ import annotations

from html import escape

__all__ = ["CSS", "document"]

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { font-family: "DejaVu Sans", "Segoe UI", system-ui, sans-serif; color: #111; background: #fff;
  max-width: 1120px; margin: 0 auto; padding: 1.2rem 1.5rem 3rem; line-height: 1.45; font-size: 15px; }
h1 { font-size: 1.45rem; margin: .1rem 0 .3rem; }
h2 { font-size: 1.3rem; border-bottom: 2px solid #333; padding-bottom: .2rem; margin-top: 1.2rem; }
h3 { font-size: 1.1rem; margin: 1.4rem 0 .4rem; }
h4 { font-size: .98rem; margin: 1rem 0 .3rem; }
p { margin: .3rem 0 .6rem; }
table { border-collapse: collapse; margin: .4rem 0 1rem; font-size: .84rem; width: 100%; }
th, td { border: 1px solid #8a8a8a; padding: .25rem .45rem; vertical-align: top; text-align: left; }
thead th { background: #e8e8e8; }
tbody th { font-weight: 600; background: #f6f6f6; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: .2rem 0 .35rem; }
.verdict { white-space: nowrap; font-weight: 600; }
.verdict.ok { color: #17631a; }
.verdict.bad { color: #a30000; }
.verdict.warn { color: #7a4d00; }
.verdict.na, .na { color: #4a4a4a; }
.num, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .95em; }
.mono { word-break: break-all; }
figure { margin: .5rem 0 1.1rem; }
figure img { max-width: 100%; height: auto; display: block; border: 1px solid #ddd; }
figcaption { font-size: .8rem; color: #333; margin-top: .25rem; }
.banner { border: 2px solid #333; padding: .3rem .7rem; margin: .4rem 0; font-weight: 600; font-size: .88rem; }
.banner.verified { border-color: #17631a; }
.banner.not_checked, .banner.unsigned { border-style: dashed; }
.context { border-left: 4px solid #999; padding: .2rem .7rem; color: #333; font-size: .88rem; margin: .4rem 0; }
.context .label { display: block; font-size: .75rem; color: #555; }
.note { font-size: .86rem; color: #333; }
nav.toc { font-size: .85rem; margin: .1rem 0 .3rem; }
.verdict.unsure { color: #7a4b00; }
table.decision td, table.decision th { padding: .18rem .45rem; }
table.decision { font-size: .8rem; }
table.decision td:nth-child(3) { white-space: nowrap; }
#summary { margin: .2rem 0 .4rem; }
details { margin: .3rem 0; }
details > summary { cursor: pointer; padding: .25rem .3rem; }
details.method { border-top: 1px solid #ccc; }
details.method[open] { padding-bottom: .6rem; }
details.method > summary .note { margin-left: .4rem; }
table.text-grid th[scope=row] { width: 15rem; }
table.text-grid td.text-row { font-size: 1rem; line-height: 1.9; }
.tok { padding: .1rem .25rem; border-radius: 3px; border: 1px solid #ccc; }
.legend { display: inline-block; width: 90px; height: .8em; vertical-align: middle;
  background: linear-gradient(to right, #2166ac, #f7f7f7, #b2182b); border: 1px solid #999; }
@media print {
  @page { size: A4; margin: 14mm 12mm; }
  body { max-width: none; padding: 0; font-size: 9.5pt; }
  nav.toc { display: none; }
  a { color: inherit; text-decoration: none; }
  h2 { break-after: avoid; }
  h3, h4 { break-after: avoid; }
  section#interactions, section#provenance { break-before: page; }
  figure, .banner, tr, details.method { break-inside: avoid; }
  .tok { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  thead { display: table-header-group; }
  table { font-size: 8pt; }
  figure img { border: none; }
}
"""


def document(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Nothing on this page may load from the network: images are data URIs, styles inline.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )
