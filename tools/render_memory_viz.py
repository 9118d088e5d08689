"""Draws a memory snapshot pickle written by `lmscope memory` with PyTorch's own viewer (MemoryViz.js,
the page behind pytorch.org/memory_viz and torch.cuda._memory_viz.trace_plot), to show that the
viewer reads our bytes as they are.

The viewer page is built locally because the CDN that MemoryViz.js and its d3 import come from may be
unreachable: the page inlines d3's UMD bundle (defining window.d3), then MemoryViz.js as a module with
its d3 import lines turned into reads of window.d3, then `add_local_files` with the base64 of the
pickle file's own bytes (not a re-pickling). The page holds PyTorch's script, so it stays out of git;
only the screenshots are kept.

  python3 tools/render_memory_viz.py --snapshot FILE.pickle --viewer PATH/MemoryViz.js \\
      --d3 PATH/d3.min.js --html OUT.html [--png OUT.png] [--view 'Active Memory Timeline'] \\
      [--select-match TEXT | --select-largest]

With --png, Debian's chromium (headless) loads the page once with --dump-dom to see what was drawn
and what the console said, then once more for the screenshot. The script prints one summary line and
exits non-zero if the view drew nothing or the page threw. --select-largest / --select-match TEXT
stand in for hovering: after the view is drawn, the page sends mouseover and mousedown to the largest
drawn allocation (of those whose detail text contains TEXT), so the detail pane shows its frames.
"""
import argparse
import base64
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile

# `import * as d3 from "...d3@7/+esm";` and `import {a, b as c} from "...d3-axis@3/+esm";`
IMPORT_RE = re.compile(
    r'^import\s+(?:\*\s+as\s+(?P<ns>\w+)|\{(?P<names>[^}]*)\})\s+from\s+["\'](?P<url>[^"\']*d3[^"\']*)["\'];?[ \t]*$',
    re.M)

# Runs as a classic script before the viewer: keeps uncaught errors where --dump-dom can see them.
ERROR_TRAP = """
window.__viz_errors = [];
function __viz_note(msg) {
  window.__viz_errors.push(msg);
  const el = document.getElementById('viz-errors') || document.createElement('pre');
  el.id = 'viz-errors';
  el.style.display = 'none';
  el.textContent = window.__viz_errors.join('\\n');
  if (!el.parentNode) document.documentElement.appendChild(el);
}
window.addEventListener('error', e => __viz_note('error: ' + e.message + ' at ' + e.lineno + ':' + e.colno));
window.addEventListener('unhandledrejection', e => __viz_note('unhandled rejection: ' + e.reason));
"""

# Appended to the module after add_local_files: picks a drawn allocation and "hovers" it.
SELECT_JS = """
setTimeout(() => {
  const want = %s;
  const size = p => { const d = p.__data__; return d && typeof d.elem === 'number' && !Array.isArray(d.size) ? d.size : -1; };
  const polys = Array.from(document.querySelectorAll('svg polygon')).filter(p => size(p) >= 0);
  polys.sort((a, b) => size(b) - size(a));
  let chosen = null;
  for (const p of polys) {
    p.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, view: window}));
    const pre = Array.from(document.querySelectorAll('pre')).find(x => x.id !== 'viz-errors' && /Addr: /.test(x.textContent));
    if (pre && (want === null || pre.textContent.includes(want))) { chosen = p; break; }
  }
  if (chosen) {
    // not bubbling: the plot's d3-zoom would take a mousedown as the start of a pan
    chosen.dispatchEvent(new MouseEvent('mousedown', {bubbles: false, view: window}));
    chosen.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, view: window}));
  }
  const mark = document.createElement('pre');
  mark.id = 'viz-selected';
  mark.style.display = 'none';
  mark.textContent = chosen ? 'selected' : 'no allocation matched';
  document.documentElement.appendChild(mark);
}, 3000);
"""


def inline_js(text):
    """Text safe to sit inside <script>...</script>."""
    return re.sub(r'</(script)', r'<\\/\1', text, flags=re.I)


def viewer_module(viewer_text):
    """MemoryViz.js with its d3 CDN imports read from window.d3 instead."""
    def repl(m):
        if m.group('ns'):
            return 'const %s = window.d3;' % m.group('ns')
        names = [n.strip() for n in m.group('names').split(',') if n.strip()]
        fields = [re.sub(r'^(\w+)\s+as\s+(\w+)$', r'\1: \2', n) for n in names]
        return 'const {%s} = window.d3;' % ', '.join(fields)
    text, n = IMPORT_RE.subn(repl, viewer_text)
    if n == 0:
        sys.exit('render_memory_viz: no d3 import line found in the viewer; nothing was replaced')
    left = re.findall(r'^\s*import\b.*$', text, re.M)
    if left:
        sys.exit('render_memory_viz: imports the page cannot satisfy offline: %s' % left)
    return text, n


def build_page(snapshot, viewer, d3, view, select):
    with open(snapshot, 'rb') as f:
        b64 = base64.b64encode(f.read()).decode('ascii')
    with open(viewer, encoding='utf-8') as f:
        module, replaced = viewer_module(f.read())
    with open(d3, encoding='utf-8') as f:
        d3_text = f.read()
    call = 'add_local_files([{name: "snapshot.pickle", base64: "%s"}], %s);\n' % (b64, _js_str(view))
    if select is not None:
        call += SELECT_JS % ('null' if select is True else _js_str(select))
    page = ('<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>%s: %s</title>\n</head>\n<body>\n'
            '<script>\n%s\n</script>\n<script>\n%s\n</script>\n<script type="module">\n%s\n%s</script>\n'
            '</body>\n</html>\n') % (html.escape(os.path.basename(snapshot)), html.escape(view),
                                   inline_js(ERROR_TRAP), inline_js(d3_text), inline_js(module), call)
    return page, replaced


def _js_str(s):
    return '"%s"' % s.replace('\\', '\\\\').replace('"', '\\"')


def chromium_binary():
    exe = shutil.which('chromium') or shutil.which('chromium-browser')
    if not exe:
        sys.exit('render_memory_viz: chromium not found (apt-get install -y chromium)')
    return exe


def run_chromium(page_path, extra):
    profile = tempfile.mkdtemp(prefix='memviz-profile-')
    try:
        cmd = [chromium_binary(), '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
               '--no-first-run', '--disable-background-networking', '--disable-component-update',
               '--disable-sync', '--user-data-dir=' + profile, '--window-size=1600,1000',
               '--virtual-time-budget=20000'] + extra + ['file://' + os.path.abspath(page_path)]
        return subprocess.run(cmd, capture_output=True, text=True, errors='replace', timeout=300)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def inspect(page_path):
    """Loads the page, returns (summary dict, console lines that look like errors)."""
    r = run_chromium(page_path, ['--enable-logging=stderr', '--v=0', '--dump-dom'])
    dom = r.stdout
    console = [l for l in r.stderr.splitlines() if 'CONSOLE' in l or 'Uncaught' in l]
    errors = [l for l in console if re.search(r'Uncaught|Error|error', l)
              and 'Failed to decode the data as JSON' not in l]
    m = re.search(r'<pre id="viz-errors"[^>]*>(.*?)</pre>', dom, re.S)
    if m:
        errors += [html.unescape(x) for x in m.group(1).splitlines()]
    body = re.sub(r'<script\b[^>]*>.*?</script>', '', dom, flags=re.S)
    ticks = [html.unescape(t) for t in re.findall(r'<text[^>]*>([^<]*B)</text>', body)]
    detail = re.search(r'<pre>(\d+ Addr: .*?)</pre>', body, re.S)
    sel = re.search(r'<pre id="viz-selected"[^>]*>(.*?)</pre>', body, re.S)
    summary = {
        'svg': body.count('<svg'), 'polygon': body.count('<polygon'), 'rect': body.count('<rect'),
        'path': body.count('<path'), 'pre': body.count('<pre'), 'ticks': ticks,
        'detail': html.unescape(detail.group(1)) if detail else None,
        'selected': sel.group(1) if sel else None, 'rc': r.returncode,
    }
    return summary, errors, console


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--snapshot', required=True, help='memory snapshot pickle')
    ap.add_argument('--viewer', required=True, help="PyTorch's torch/utils/viz/MemoryViz.js")
    ap.add_argument('--d3', required=True, help="d3 v7's UMD bundle, dist/d3.min.js")
    ap.add_argument('--html', required=True, help='page to write')
    ap.add_argument('--png', help='screenshot to write (needs chromium)')
    ap.add_argument('--view', default='Active Memory Timeline')
    g = ap.add_mutually_exclusive_group()
    g.add_argument('--select-largest', action='store_true', help='hover the largest drawn allocation')
    g.add_argument('--select-match', metavar='TEXT', help='hover the largest allocation whose detail has TEXT')
    a = ap.parse_args()

    select = a.select_match if a.select_match is not None else (True if a.select_largest else None)
    page, replaced = build_page(a.snapshot, a.viewer, a.d3, a.view, select)
    with open(a.html, 'w', encoding='utf-8') as f:
        f.write(page)
    if not a.png:
        print('wrote %s (%d d3 import lines replaced, %d bytes)' % (a.html, replaced, len(page)))
        return 0

    s, errors, console = inspect(a.html)
    r = run_chromium(a.html, ['--screenshot=' + os.path.abspath(a.png)])
    if r.returncode != 0 or not os.path.exists(a.png):
        sys.stderr.write(r.stderr[-4000:])
        sys.exit('render_memory_viz: chromium screenshot failed (rc %d)' % r.returncode)

    drawn = s['polygon'] + s['rect'] + s['path']
    line = ('%s [%s]: svg %d, polygons %d, rects %d, paths %d, pre %d; y axis %s; console errors %d'
            % (os.path.basename(a.snapshot), a.view, s['svg'], s['polygon'], s['rect'], s['path'], s['pre'],
               (s['ticks'][0] + ' .. ' + s['ticks'][-1]) if s['ticks'] else 'none', len(errors)))
    print(line + ' -> ' + a.png)
    if select is not None:
        print('selection: %s' % (s['selected'] or 'script did not run'))
        if s['detail']:
            print('detail: ' + s['detail'][:2000])
    for e in errors:
        print('console: ' + e)
    ok = drawn >= 10 and not errors and (select is None or s['selected'] == 'selected')
    if not ok:
        for l in console[-20:]:
            print('log: ' + l, file=sys.stderr)
        print('render_memory_viz: the view did not draw (or threw); see above', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
