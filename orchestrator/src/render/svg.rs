//! What the hand-written SVG pictures (chart, timeline) share.

/// Text escaped for an SVG text node or attribute value.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
