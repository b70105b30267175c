//! The commands the node daemon sends, run without a shell when they allow it.
//!
//! `Exec.command` is a shell command (sandbox.v1). For ExecCommand the node daemon sends one
//! of a single, fully quoted form:
//!
//! ```text
//! export NAME='value'; … cd '/dir' && exec 'argv0' 'arg1' …
//! ```
//!
//! where every word is single-quoted (`'` itself written `'\''`). A shell adds one more
//! fork+exec inside gVisor (~7.5 ms each), so the agent recognises exactly this form and runs
//! the argv directly with that environment and working directory. Anything else (a dollar,
//! a pipe, a redirection, an unquoted glob, …) is not this form and goes to `/bin/sh -c`.

/// A command the agent can run without a shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Direct {
    /// Variables to set, in order.
    pub env: Vec<(String, String)>,
    /// Working directory (`cd`), if given.
    pub cwd: Option<String>,
    /// The program and its arguments.
    pub argv: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Semi,
    And,
}

/// Unquoted characters that mean the same to a shell as when quoted.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-./,:@%+=".contains(c)
}

fn tokens(s: &str) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    let mut word: Option<String> = None;
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = word.take() {
                    out.push(Token::Word(w));
                }
            }
            ';' => {
                if let Some(w) = word.take() {
                    out.push(Token::Word(w));
                }
                out.push(Token::Semi);
            }
            '&' => {
                if chars.next() != Some('&') {
                    return None;
                }
                if let Some(w) = word.take() {
                    out.push(Token::Word(w));
                }
                out.push(Token::And);
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        q => w.push(q),
                    }
                }
            }
            '\\' => {
                // Only the `\'` of the quoting scheme.
                if chars.next() != Some('\'') {
                    return None;
                }
                word.get_or_insert_with(String::new).push('\'');
            }
            c if plain(c) => word.get_or_insert_with(String::new).push(c),
            _ => return None,
        }
    }
    if let Some(w) = word.take() {
        out.push(Token::Word(w));
    }
    Some(out)
}

fn is_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses the daemon's form; None for anything else (run it with a shell).
pub fn parse(s: &str) -> Option<Direct> {
    let toks = tokens(s)?;
    let mut it = toks.into_iter().peekable();
    let mut env = Vec::new();
    let mut cwd = None;
    loop {
        match it.next()? {
            Token::Word(w) if w == "export" => {
                let Token::Word(kv) = it.next()? else {
                    return None;
                };
                let (k, v) = kv.split_once('=')?;
                if !is_name(k) || it.next()? != Token::Semi {
                    return None;
                }
                env.push((k.to_string(), v.to_string()));
            }
            Token::Word(w) if w == "cd" && cwd.is_none() => {
                let Token::Word(dir) = it.next()? else {
                    return None;
                };
                if it.next()? != Token::And {
                    return None;
                }
                cwd = Some(dir);
            }
            Token::Word(w) if w == "exec" => break,
            _ => return None,
        }
    }
    let mut argv = Vec::new();
    for t in it {
        match t {
            Token::Word(w) => argv.push(w),
            _ => return None,
        }
    }
    // A program name must not be empty, nor one a shell would treat as an assignment.
    if argv.first().is_none_or(|a| a.is_empty()) {
        return None;
    }
    Some(Direct { env, cwd, argv })
}

/// Quotes a word for a POSIX shell, the way `parse` reads it back.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Builds the daemon's form. None when an env name cannot be exported by a shell.
pub fn render(env: &[(String, String)], cwd: &str, argv: &[String]) -> Option<String> {
    let mut s = String::new();
    for (k, v) in env {
        if !is_name(k) {
            return None;
        }
        s.push_str(&format!("export {k}={}; ", quote(v)));
    }
    s.push_str(&format!("cd {} && exec", quote(cwd)));
    for a in argv {
        s.push(' ');
        s.push_str(&quote(a));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_daemons_form_round_trips() {
        let env = vec![
            ("A_B".to_string(), "x'y $HOME `id`".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let argv = v(&[
            "python3",
            "-c",
            "print('it''s')",
            "$HOME; rm -rf /",
            "",
            "a\nb",
        ]);
        let s = render(&env, "/work space", &argv).unwrap();
        let d = parse(&s).unwrap();
        assert_eq!(d.env, env);
        assert_eq!(d.cwd.as_deref(), Some("/work space"));
        assert_eq!(d.argv, argv);
    }

    #[test]
    fn anything_else_goes_to_the_shell() {
        for s in [
            "echo $HOME",
            "exec echo hi | cat",
            "cd /tmp && exec ls > out",
            "exec 'a'\"b\"",
            "exec *",
            "export 1A='x'; exec true",
            "export A; exec true",
            "exec",
            "exec ''",
            "cd '/a' ; exec true",
            "true",
            "exec 'unterminated",
            "exec a\\b",
            "exec a & b",
        ] {
            assert_eq!(parse(s), None, "{s}");
        }
        assert!(render(&[("A-B".into(), "1".into())], "/", &v(&["true"])).is_none());
    }

    #[test]
    fn plain_words_are_words() {
        let d = parse("exec /bin/echo a-b.c,d:e@f%g+h=i").unwrap();
        assert_eq!(d.argv, v(&["/bin/echo", "a-b.c,d:e@f%g+h=i"]));
        assert_eq!(d.cwd, None);
    }
}
