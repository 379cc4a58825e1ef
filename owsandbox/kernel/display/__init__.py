"""What the browser may be shown of what the box wrote: untrusted output made safe, box text without
terminal controls, SVG cleaned.
"""
