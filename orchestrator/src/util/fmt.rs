//! How numbers and lists are written in every table and sentence.

/// Four significant figures, no exponent for ordinary magnitudes.
pub fn fmt_num(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-4..6).contains(&mag) {
        return format!("{x:.3e}");
    }
    let decimals = (3 - mag).max(0) as usize;
    format!("{x:.decimals$}")
}

/// "engine" -> "Engine".
pub fn capitalise_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// "a, b and c".
pub fn and_list(v: &[String]) -> String {
    match v.len() {
        0 => String::new(),
        1 => v[0].clone(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// `s` cut to `n` characters, with "..." when it was longer.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_four_figures() {
        assert_eq!(fmt_num(0.014369), "0.01437");
        assert_eq!(fmt_num(280.9), "280.9");
        assert_eq!(fmt_num(644096.0), "644096");
        assert_eq!(fmt_num(1.0), "1.000");
    }

    #[test]
    fn lists_and_names_read_as_prose() {
        assert_eq!(
            and_list(&["a".into(), "b".into(), "c".into()]),
            "a, b and c"
        );
        assert_eq!(capitalise_first("engine"), "Engine");
        assert_eq!(clip("abcdef", 3), "abc...");
    }
}
