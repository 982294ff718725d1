//! Renders `docs/options.md` from the registry.

use std::fmt::Write as _;

use super::ConnectorKind;
use super::registry::{FIXED_BUDGETS, REGISTRY};
use super::spec::{OptionGroup, OptionSpec};

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

fn connector_section(out: &mut String, kind: ConnectorKind) {
    let _ = writeln!(
        out,
        "## {} (`connector = '{}'`, `STORED AS {}`)\n",
        kind.display_name(),
        kind.name(),
        kind.stored_as()
    );
    let _ = writeln!(
        out,
        "`LOCATION` carries the {} (an empty `LOCATION ''` means none). The emulator variable is `{}`.\n",
        match kind {
            ConnectorKind::PubSub => "topic",
            ConnectorKind::CloudTasks => "queue",
            ConnectorKind::Bigtable => "table",
        },
        kind.emulator_env_var()
    );
    for (group, title) in [
        (OptionGroup::Connection, "Connection"),
        (OptionGroup::Mapping, "Row mapping"),
        (OptionGroup::Writer, "Writer"),
    ] {
        let specs: Vec<&OptionSpec> = REGISTRY
            .iter()
            .copied()
            .filter(|s| {
                s.applies_to(kind)
                    && s.connectors.len() < ConnectorKind::ALL.len()
                    && s.group == group
            })
            .collect();
        if specs.is_empty() {
            continue;
        }
        let _ = writeln!(out, "### {title}\n");
        if kind == ConnectorKind::PubSub && group == OptionGroup::Writer {
            out.push_str(
                "Where a default says *Java SDK default*, it is the default of the official Java client's \
                 publisher settings, which this connector takes over so that a pipeline moved from Java \
                 behaves the same.\n\n",
            );
        }
        table(out, &specs);
    }
    let budgets: Vec<_> = FIXED_BUDGETS
        .iter()
        .filter(|b| b.connector == kind)
        .collect();
    if !budgets.is_empty() {
        out.push_str(
            "### Fixed budgets (not options)\n\n| Budget | Value | Why |\n|---|---|---|\n",
        );
        for b in budgets {
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
pub(super) fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "# Option reference\n\n\
         <!-- Generated from the option registry (src/options/registry.rs) by \
         gcp_sql::options::reference_markdown(). Do not edit by hand: run \
         `GCP_SQL_BLESS=1 cargo test --test options` to regenerate. -->\n\n",
    );
    out.push_str(
        "Every option below is accepted by both SQL forms, and by the typed builders of the Rust API \
         (writer options are the builder methods of the same name):\n\n\
         ```sql\n\
         CREATE TABLE clicks (user_id BIGINT, url VARCHAR)\n\
         WITH (connector = 'pubsub', topic = 'projects/demo/topics/clicks', batch_element_count_threshold = 500);\n\n\
         CREATE EXTERNAL TABLE clicks (user_id BIGINT, url VARCHAR) STORED AS PUBSUB\n\
         LOCATION 'projects/demo/topics/clicks' OPTIONS ('batch_element_count_threshold' '500');\n\
         ```\n\n\
         Names are case-insensitive; DataFusion's `format.` prefix is ignored, and a name given twice \
         (also as `k` and `format.k`) is an error. An unknown name is an error that suggests the nearest \
         valid one. Every value is checked when the table is declared; declaring a table never contacts \
         the service.\n\n",
    );
    out.push_str(
        "## Value syntax\n\n\
         - **duration**: a number with a unit — `'250us'`, `'500ms'`, `'10s'`, `'1m'`, `'2h'`, or combined \
         `'1m 30s'`. `'0s'` (or `'0'`) is zero; any other number needs a unit.\n\
         - **integer**: decimal, e.g. `'1000'`; `-1` means unbounded where the bounds say so.\n\
         - **number**: decimal, e.g. `'1.5'`.\n\
         - **boolean**: `'true'` or `'false'`.\n\
         - **column** / **column list**: a column name, or names separated by commas (`'a, b'`).\n\
         - **header list**: `'Name: value; Other-Name: value'`. A `;` followed by `Name:` starts the next \
         header; any other `;` belongs to the value.\n\
         - **resource names**: a full name (`projects/P/topics/T`, `projects/P/locations/L/queues/Q`, \
         `projects/P/instances/I/tables/T`) or a short id resolved with `project` (and `location` or \
         `instance`).\n\n",
    );
    out.push_str("## Common options (every connector)\n\n");
    let common: Vec<&OptionSpec> = REGISTRY
        .iter()
        .copied()
        .filter(|s| s.connectors.len() == ConnectorKind::ALL.len())
        .collect();
    table(&mut out, &common);
    for kind in ConnectorKind::ALL {
        connector_section(&mut out, kind);
    }
    let trimmed = out.trim_end().to_string();
    trimmed + "\n"
}
