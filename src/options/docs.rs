//! Renders the option reference (`docs/options.md`) from the option list of each connector of
//! a set: one table of the options every connector shares, then one section per connector.

use std::fmt::Write as _;

use super::spec::{DefaultValue, OptionGroup, OptionSpec};

/// A connector setting that is not an option, listed in the reference so that its value is
/// documented where the options are.
#[derive(Debug)]
pub struct FixedBudget {
    /// What it bounds.
    pub name: &'static str,
    /// Its value.
    pub value: DefaultValue,
    /// Why it has this value.
    pub description: &'static str,
}

/// One connector's section of the reference.
#[derive(Debug)]
pub struct Section<'a> {
    /// The heading, without the `##`.
    pub heading: String,
    /// The paragraph under the heading.
    pub intro: String,
    /// Every option the connector accepts, in the order the section lists them; the options
    /// every section has go to the common table instead.
    pub options: &'a [&'static OptionSpec],
    /// A paragraph shown above the table of a group.
    pub group_notes: &'a [(OptionGroup, &'a str)],
    /// The connector's fixed budgets.
    pub fixed_budgets: &'a [FixedBudget],
    /// The heading of the [`OptionGroup::Writer`] table: `"Writer"` in a sink's section; a
    /// source's section has only the failure options in that group.
    pub writer_title: &'a str,
}

/// What the reference is rendered from.
#[derive(Debug)]
pub struct Reference<'a> {
    /// The text of the comment that says how the file is generated.
    pub generated_by: &'a str,
    /// The paragraphs after the title, each ending with a blank line.
    pub introduction: &'a str,
    /// Value-syntax entries beyond the generic ones (`- **name**: text`, one per entry).
    pub extra_syntax: &'a [&'a str],
    /// The heading of the table of options every section has.
    pub common_heading: &'a str,
    /// One section per connector.
    pub sections: Vec<Section<'a>>,
    /// One section per source (a connector's table that reads), every option listed: the
    /// common table above is the sinks'.
    pub sources: Vec<Section<'a>>,
}

/// Escapes text for a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn table(out: &mut String, specs: &[&OptionSpec]) {
    out.push_str("| Option | Type | Default | Bounds and rules | Meaning | Example |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for s in specs {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | `'{}'` |",
            s.name,
            cell(&s.kind.type_text()),
            cell(&s.default.text()),
            cell(&s.bounds_text()),
            cell(s.description),
            cell(s.example),
        );
    }
    out.push('\n');
}

fn contains(list: &[&OptionSpec], spec: &OptionSpec) -> bool {
    list.iter().any(|s| std::ptr::eq(*s, spec))
}

/// The options every section lists, in the first section's order.
pub fn common_options<'a>(sections: &[Section<'a>]) -> Vec<&'static OptionSpec> {
    match sections.split_first() {
        None => Vec::new(),
        Some((first, rest)) => first
            .options
            .iter()
            .copied()
            .filter(|s| rest.iter().all(|r| contains(r.options, s)))
            .collect(),
    }
}

fn section(out: &mut String, s: &Section<'_>, common: &[&OptionSpec]) {
    let _ = writeln!(out, "## {}\n", s.heading);
    let _ = writeln!(out, "{}\n", s.intro);
    for (group, title) in [
        (OptionGroup::Connection, "Connection"),
        (OptionGroup::Mapping, "Row mapping"),
        (OptionGroup::Writer, s.writer_title),
        (OptionGroup::Reader, "Reading"),
    ] {
        let specs: Vec<&OptionSpec> = s
            .options
            .iter()
            .copied()
            .filter(|o| o.group == group && !contains(common, o))
            .collect();
        if specs.is_empty() {
            continue;
        }
        let _ = writeln!(out, "### {title}\n");
        for (_, note) in s.group_notes.iter().filter(|(g, _)| *g == group) {
            let _ = writeln!(out, "{note}\n");
        }
        table(out, &specs);
    }
    if !s.fixed_budgets.is_empty() {
        out.push_str(
            "### Fixed budgets (not options)\n\n| Budget | Value | Why |\n|---|---|---|\n",
        );
        for b in s.fixed_budgets {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                b.name,
                cell(&b.value.text()),
                cell(b.description)
            );
        }
        out.push('\n');
    }
}

/// The whole reference.
pub fn render(r: &Reference<'_>) -> String {
    let mut out = String::new();
    let _ = write!(out, "# Option reference\n\n<!-- {} -->\n\n", r.generated_by);
    out.push_str(r.introduction);
    out.push_str(
        "## Value syntax\n\n\
         - **duration**: a number with a unit — `'250us'`, `'500ms'`, `'10s'`, `'1m'`, `'2h'`, or combined \
         `'1m 30s'`. `'0s'` (or `'0'`) is zero; any other number needs a unit.\n\
         - **integer**: decimal, e.g. `'1000'`; `-1` means unbounded where the bounds say so.\n\
         - **number**: decimal, e.g. `'1.5'`.\n\
         - **boolean**: `'true'` or `'false'`.\n\
         - **column** / **column list**: a column name, or names separated by commas (`'a, b'`).\n\
         - **header list**: `'Name: value; Other-Name: value'`. A `;` followed by `Name:` starts the next \
         header; any other `;` belongs to the value.\n",
    );
    for entry in r.extra_syntax {
        let _ = writeln!(out, "- {entry}");
    }
    out.push('\n');
    let common = common_options(&r.sections);
    let _ = writeln!(out, "## {}\n", r.common_heading);
    table(&mut out, &common);
    for s in &r.sections {
        section(&mut out, s, &common);
    }
    for s in &r.sources {
        section(&mut out, s, &[]);
    }
    let trimmed = out.trim_end().to_string();
    trimmed + "\n"
}
