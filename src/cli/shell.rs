//! The interactive shell: reads statements (ended by `;`) and backslash commands (`\?` lists
//! them) with line editing and history, runs each, prints errors and goes on.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::core::StopKind;
use crate::sql::StatementControl;

use datafusion::prelude::SessionContext;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::Interrupts;
use super::commands::{
    Flow, HELP, at_statement_boundary, is_command_line, parse_command, run_command,
};
use super::exec::{PrintOptions, run_sql};

/// The options whose values the history does not keep, as `\\d` does not show them: a Cloud
/// Tasks sink's `headers` (tokens, keys) and `url` (which may carry credentials or a signed
/// query).
const SECRET_OPTIONS: [&str; 2] = ["headers", "url"];

/// `statement` as the history keeps it: the quoted value that follows one of
/// [`SECRET_OPTIONS`] (`headers = '...'`, `'headers' '...'`) becomes `'<redacted>'`; the rest is
/// kept as typed. A statement that does not tokenize is kept as typed.
pub(crate) fn history_entry(statement: &str) -> String {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, statement)
        .with_unescape(false)
        .tokenize()
    else {
        return statement.to_string();
    };
    let is_secret = |token: &Token| match token {
        Token::Word(word) => SECRET_OPTIONS.contains(&word.value.to_ascii_lowercase().as_str()),
        Token::SingleQuotedString(name) => {
            SECRET_OPTIONS.contains(&name.to_ascii_lowercase().as_str())
        }
        _ => false,
    };
    let mut out = String::with_capacity(statement.len());
    let mut after_secret = false;
    for token in &tokens {
        match token {
            Token::SingleQuotedString(_) if after_secret => {
                out.push_str("'<redacted>'");
                after_secret = false;
                continue;
            }
            Token::Whitespace(_) | Token::Eq => {}
            other => after_secret = is_secret(other),
        }
        out.push_str(&token.to_string());
    }
    out
}

/// The history file name, in `$HOME`.
pub const HISTORY_FILE: &str = ".gcp_sql_history";

const PROMPT: &str = "gcp-sql> ";
const CONTINUATION_PROMPT: &str = "      -> ";

/// Where the history is kept: `$HOME/.gcp_sql_history`, or nowhere without `HOME`.
pub fn history_path() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(HISTORY_FILE))
}

enum Line {
    Text(String),
    /// Ctrl-C typed at the prompt of a terminal.
    Cleared,
    End,
}

/// Runs the shell until end of input, `\q` (or `quit`, `exit`) or a Ctrl-C that arrives while waiting for input
/// without a terminal (then the exit code is 130). A failed statement prints its error and the
/// shell goes on; the exit code is then 1 at the end, so a script piped into the shell can tell.
pub async fn run_shell(
    ctx: &SessionContext,
    options: PrintOptions,
    interrupts: &mut Interrupts,
) -> ExitCode {
    let mut options = options;
    let mut editor = match DefaultEditor::new() {
        Ok(editor) => editor,
        Err(e) => {
            eprintln!("Error: cannot start the line editor: {e}");
            return ExitCode::FAILURE;
        }
    };
    let history = history_path();
    if let Some(path) = &history {
        // A missing or unreadable history file is not a reason to refuse a shell.
        let _ = editor.load_history(path);
    }
    if !options.quiet {
        eprintln!(
            "gcp-sql {}: type \\? for help, \\q to quit.",
            env!("CARGO_PKG_VERSION")
        );
    }
    let mut buffer = String::new();
    let mut code = ExitCode::SUCCESS;
    loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            CONTINUATION_PROMPT
        };
        // rustyline blocks its thread; read on a blocking thread so a Ctrl-C can still end us.
        let reading = tokio::task::spawn_blocking(move || {
            let line = match editor.readline(prompt) {
                Ok(line) => Line::Text(line),
                Err(ReadlineError::Interrupted) => Line::Cleared,
                Err(ReadlineError::Eof) => Line::End,
                Err(e) => {
                    eprintln!("Error: cannot read input: {e}");
                    Line::End
                }
            };
            (editor, line)
        });
        let (returned, line) = tokio::select! {
            read = reading => match read {
                Ok(read) => read,
                Err(e) => {
                    eprintln!("Error: the input reader failed: {e}");
                    return ExitCode::FAILURE;
                }
            },
            signal = interrupts.next() => {
                // The blocked reader cannot be cancelled; the caller shuts the runtime down
                // without waiting for it.
                eprintln!("Interrupted.");
                return ExitCode::from(signal.exit_code());
            }
        };
        editor = returned;
        let line = match line {
            Line::Text(line) => line,
            Line::Cleared => {
                buffer.clear();
                eprintln!("^C");
                continue;
            }
            Line::End => break,
        };
        if buffer.is_empty() {
            match line.trim() {
                "" => continue,
                "\\q" | "quit" | "exit" => break,
                "\\?" | "help" => {
                    println!("{HELP}");
                    continue;
                }
                _ => {}
            }
        }
        if is_command_line(&line) && at_statement_boundary(&buffer) {
            // What is pending is only blanks and comments: the command starts afresh.
            buffer.clear();
            let _ = editor.add_history_entry(line.trim());
            match parse_command(&line) {
                Ok(command) => match run_command(ctx, &command, &mut options).await {
                    Ok(Flow::Continue) => {}
                    Ok(Flow::Quit) => break,
                    Err(e) => {
                        eprintln!("Error: {e}");
                        code = ExitCode::FAILURE;
                    }
                },
                Err(e) => {
                    eprintln!("Error: {e}");
                    code = ExitCode::FAILURE;
                }
            }
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if buffer.trim_end().ends_with(';') {
            let statement = std::mem::take(&mut buffer);
            let _ = editor.add_history_entry(history_entry(statement.trim()));
            if !run_one(ctx, &statement, options, interrupts).await {
                code = ExitCode::FAILURE;
            }
        }
    }
    if !buffer.trim().is_empty() {
        // Input ended in the middle of a statement without ';': run what was typed.
        let _ = editor.add_history_entry(history_entry(buffer.trim()));
        if !run_one(ctx, &buffer, options, interrupts).await {
            code = ExitCode::FAILURE;
        }
    }
    if let Some(path) = &history
        && let Err(e) = editor.save_history(path)
    {
        eprintln!(
            "warning: cannot save the history to {}: {e}",
            path.display()
        );
    }
    code
}

/// Runs the statements of `sql`, printing an error if one fails. A Ctrl-C cancels them.
/// Returns whether they all succeeded.
async fn run_one(
    ctx: &SessionContext,
    sql: &str,
    options: PrintOptions,
    interrupts: &mut Interrupts,
) -> bool {
    let control = ctx.state().config().get_extension::<StatementControl>();
    let running = run_sql(ctx, sql, options);
    tokio::pin!(running);
    let mut stopping = false;
    let ok = loop {
        tokio::select! {
            outcome = &mut running => break match outcome {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("Error: {e}");
                    false
                }
            },
            signal = interrupts.next() => {
                // While sink writers run, a first signal stops them gracefully and a second
                // aborts them; the statement then ends with its counts. Otherwise the
                // statement is cancelled at once.
                match &control {
                    Some(control) if stopping => {
                        eprintln!("{}: aborting.", signal.name());
                        control.stop(StopKind::Abort, format!("aborted ({} again)", signal.name()));
                    }
                    Some(control) if control.running_writers() > 0 => {
                        eprintln!(
                            "{}: stopping; no more input is read, and what was read is being delivered. {} again to abort.",
                            signal.name(),
                            signal.name()
                        );
                        control.stop(StopKind::Drain, format!("stop requested ({})", signal.name()));
                        stopping = true;
                    }
                    _ => {
                        eprintln!("Error: cancelled by {}", signal.name());
                        break false;
                    }
                }
            }
        }
    };
    if let Some(control) = &control {
        // The next statement starts without this one's stop request.
        control.rearm();
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::history_entry;

    #[test]
    fn history_keeps_no_header_or_url_value_in_either_sql_form() {
        let with = "CREATE TABLE jobs (body VARCHAR) WITH (connector = 'cloud_tasks', \
                    queue = 'projects/p/locations/l/queues/q', url = 'https://u:pw@h/run?sig=1', \
                    headers = 'Authorization: Bearer abc')";
        let kept = history_entry(with);
        assert!(!kept.contains("Bearer abc"), "{kept}");
        assert!(!kept.contains("pw@"), "{kept}");
        assert!(kept.contains("headers = '<redacted>'"), "{kept}");
        assert!(
            kept.contains("queue = 'projects/p/locations/l/queues/q'"),
            "{kept}"
        );
        let options = "CREATE EXTERNAL TABLE j (b VARCHAR) STORED AS CLOUD_TASKS LOCATION 'q' \
                       OPTIONS ('headers' 'X-Key: s3cret', 'url' 'https://h/r')";
        let kept = history_entry(options);
        assert!(!kept.contains("s3cret"), "{kept}");
        assert!(kept.contains("'headers' '<redacted>'"), "{kept}");
        // Anything else is kept as typed.
        assert_eq!(history_entry("SELECT 'headers', 1"), "SELECT 'headers', 1");
    }
}
