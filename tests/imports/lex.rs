//! Source text as code only, cut into tokens: comments, strings and character literals
//! blanked out first, so that a `crate::` written inside one is no path.

/// One token of code: an identifier (keywords included), `::`, or one other character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// An identifier or keyword (`r#type` as `type`), or a number.
    Word(String),
    /// The path separator.
    PathSep,
    /// Any other character that is not white space.
    Punct(char),
}

impl Token {
    /// Whether this is the word `word`.
    pub(crate) fn is(&self, word: &str) -> bool {
        matches!(self, Token::Word(w) if w == word)
    }

    /// The word, if this is one.
    pub(crate) fn word(&self) -> Option<&str> {
        match self {
            Token::Word(w) => Some(w),
            _ => None,
        }
    }
}

/// The tokens of `text`, its comments and literals left out.
pub(crate) fn tokens(text: &str) -> Vec<Token> {
    let code: Vec<char> = code_only(text).chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident(c) {
            let start = i;
            while i < code.len() && is_ident(code[i]) {
                i += 1;
            }
            let word: String = code[start..i].iter().collect();
            // A raw identifier: `r#type` names `type`.
            if word == "r"
                && code.get(i) == Some(&'#')
                && code.get(i + 1).is_some_and(|&c| is_ident(c))
            {
                i += 1;
                continue;
            }
            out.push(Token::Word(word));
        } else if c == ':' && code.get(i + 1) == Some(&':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// `text` with every comment, string and character literal replaced by spaces, its
/// newlines kept.
pub(crate) fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        match literal_end(&chars, i) {
            Some(end) => {
                out.extend(
                    chars[i..end]
                        .iter()
                        .map(|&c| if c == '\n' { '\n' } else { ' ' }),
                );
                i = end;
            }
            None => {
                out.push(chars[i]);
                i += 1;
            }
        }
    }
    out
}

/// Where the comment or literal starting at `i` ends (past its last character), if one
/// starts there; an unterminated one ends with the text.
fn literal_end(chars: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| chars.get(k).copied();
    let after_ident = i > 0 && is_ident(chars[i - 1]);
    match chars[i] {
        '/' if at(i + 1) == Some('/') => Some(
            (i..chars.len())
                .find(|&k| chars[k] == '\n')
                .unwrap_or(chars.len()),
        ),
        '/' if at(i + 1) == Some('*') => Some(block_comment_end(chars, i)),
        '"' => Some(string_end(chars, i + 1)),
        'r' if !after_ident => raw_string_end(chars, i + 1),
        'b' | 'c' if !after_ident && at(i + 1) == Some('r') => raw_string_end(chars, i + 2),
        '\'' if at(i + 1) == Some('\\') => {
            // An escape: `'\''`, `'\n'`, `'\u{1F600}'`.
            let close = (i + 3..chars.len()).find(|&k| chars[k] == '\'');
            Some(close.map_or(chars.len(), |k| k + 1))
        }
        // `'x'` is a character; `'a` (no quote after one character) a lifetime or label.
        '\'' if at(i + 2) == Some('\'') => Some(i + 3),
        _ => None,
    }
}

/// The end of a `/* … */` comment starting at `i`; they nest.
fn block_comment_end(chars: &[char], i: usize) -> usize {
    let mut depth = 0usize;
    let mut k = i;
    while k + 1 < chars.len() {
        match (chars[k], chars[k + 1]) {
            ('/', '*') => {
                depth += 1;
                k += 2;
            }
            ('*', '/') => {
                depth -= 1;
                k += 2;
                if depth == 0 {
                    return k;
                }
            }
            _ => k += 1,
        }
    }
    chars.len()
}

/// The end of a string whose text starts at `from`: past its unescaped closing quote.
fn string_end(chars: &[char], from: usize) -> usize {
    let mut k = from;
    while k < chars.len() {
        match chars[k] {
            '\\' => k += 2,
            '"' => return k + 1,
            _ => k += 1,
        }
    }
    chars.len()
}

/// The end of a raw string whose hashes start at `from` (after its `r`), if one does:
/// `r"…"`, `r#"…"#` and so on.
fn raw_string_end(chars: &[char], from: usize) -> Option<usize> {
    let hashes = chars[from..].iter().take_while(|&&c| c == '#').count();
    if chars.get(from + hashes) != Some(&'"') {
        return None;
    }
    let mut k = from + hashes + 1;
    while k < chars.len() {
        if chars[k] == '"'
            && chars[k + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(chars.len())
}

/// Whether `c` can be part of an identifier or a number.
fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}
