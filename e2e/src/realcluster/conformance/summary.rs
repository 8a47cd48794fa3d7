//! What Kubernetes' e2e suite printed, read back: its summary line and, from its JUnit
//! report, every spec with its state and time (pure; no I/O).

use std::time::Duration;

/// The suite's own totals, from `Ran N of M Specs` and `N Passed | N Failed | ...`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub ran: u32,
    pub of: u32,
    pub passed: u32,
    pub failed: u32,
    pub pending: u32,
    pub skipped: u32,
}

impl Totals {
    /// Every spec that ran passed, and none was skipped.
    pub fn clean(&self) -> bool {
        self.ran > 0 && self.failed == 0 && self.passed == self.ran && self.skipped == 0
    }
}

/// Reads the totals from ginkgo's closing lines; `None` if the run never got there.
pub fn totals(output: &str) -> Option<Totals> {
    let mut t = Totals::default();
    let mut seen_ran = false;
    let mut seen_counts = false;
    for line in output.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Ran ") {
            // "Ran 17 of 7000 Specs in 812.3 seconds"
            let w: Vec<&str> = rest.split_whitespace().collect();
            if let [r, "of", o, ..] = w[..]
                && let (Ok(r), Ok(o)) = (r.parse(), o.parse())
            {
                t.ran = r;
                t.of = o;
                seen_ran = true;
            }
        }
        if line.contains(" Passed | ") && line.contains(" Failed") {
            // "SUCCESS! -- 17 Passed | 0 Failed | 0 Pending | 6983 Skipped"
            let counts = line.rsplit("-- ").next().unwrap_or(line);
            for part in counts.split('|') {
                let w: Vec<&str> = part.split_whitespace().collect();
                if let [n, what] = w[..] {
                    let Ok(n) = n.parse::<u32>() else { continue };
                    match what {
                        "Passed" => t.passed = n,
                        "Failed" => t.failed = n,
                        "Pending" => t.pending = n,
                        "Skipped" => t.skipped = n,
                        _ => {}
                    }
                }
            }
            seen_counts = true;
        }
    }
    // ginkgo counts the specs that the focus left out as skipped: only those that
    // ran and then skipped themselves count against a clean run
    t.skipped = t.skipped.saturating_sub(t.of.saturating_sub(t.ran));
    (seen_ran && seen_counts).then_some(t)
}

/// One spec of the JUnit report.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub name: String,
    pub state: State,
    pub time: Duration,
    /// The first line of a failure or skip message.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Passed,
    Failed,
    Skipped,
}

/// The specs that ran, from ginkgo's JUnit report: one `<testcase name="[It] .."
/// status=".." time="..">` per spec. The specs the focus left out and the suite's
/// own passed steps (`[SynchronizedBeforeSuite]`, ...) are dropped; a failed suite
/// step is kept.
pub fn specs(junit: &str) -> Vec<Spec> {
    let mut out = Vec::new();
    let mut rest = junit;
    while let Some(start) = rest.find("<testcase ") {
        rest = &rest[start..];
        let end_tag = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end_tag];
        let self_closing = tag.ends_with('/');
        let body_end = if self_closing {
            end_tag
        } else {
            rest.find("</testcase>").unwrap_or(rest.len())
        };
        let body = &rest[end_tag.min(body_end)..body_end];
        let status = attr(tag, "status").unwrap_or_default();
        let state = match status.as_str() {
            "passed" => State::Passed,
            "skipped" | "pending" => State::Skipped,
            _ if body.contains("<failure") || body.contains("<error") => State::Failed,
            _ if body.contains("<skipped") => State::Skipped,
            "failed" | "panicked" | "interrupted" | "aborted" | "timedout" => State::Failed,
            _ => State::Passed,
        };
        let message = ["<failure message=\"", "<skipped message=\""]
            .iter()
            .find_map(|m| {
                body.find(m).map(|i| {
                    let v = &body[i + m.len()..];
                    unescape(v.split('"').next().unwrap_or(""))
                })
            })
            .unwrap_or_default();
        // the focus leaves specs out as skipped with the bare message "skipped"; a
        // spec that ran and skipped itself says why ("skipped - <reason>")
        let skipped_by_focus = state == State::Skipped && matches!(message.trim(), "" | "skipped");
        // the suite's own passed steps ([ReportAfterSuite], ...) are no specs
        let suite_step = state == State::Passed && !tag.contains("name=\"[It]");
        if !skipped_by_focus && !suite_step {
            out.push(Spec {
                name: unescape(&attr(tag, "name").unwrap_or_default()),
                state,
                time: Duration::from_secs_f64(
                    attr(tag, "time")
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0.0),
                ),
                message: message.lines().next().unwrap_or("").to_string(),
            });
        }
        rest = &rest[body_end.max(1)..];
    }
    out
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(tag[i..].split('"').next()?.to_string())
}

fn unescape(s: &str) -> String {
    s.replace("&#xA;", "\n")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAIL: &str = "\
------------------------------
Ran 17 of 7136 Specs in 1203.551 seconds
SUCCESS! -- 17 Passed | 0 Failed | 0 Pending | 7119 Skipped
PASS
";

    #[test]
    fn totals_of_a_clean_run() {
        let t = totals(TAIL).unwrap();
        assert_eq!(
            t,
            Totals {
                ran: 17,
                of: 7136,
                passed: 17,
                failed: 0,
                pending: 0,
                skipped: 0
            }
        );
        assert!(t.clean());
    }

    #[test]
    fn a_spec_that_skipped_itself_is_not_clean() {
        let out = "Ran 17 of 7136 Specs in 1.0 seconds\n\
                   FAIL! -- 16 Passed | 0 Failed | 0 Pending | 7120 Skipped\n";
        let t = totals(out).unwrap();
        assert_eq!(t.skipped, 1);
        assert!(!t.clean());
        let out = "Ran 17 of 7136 Specs in 1.0 seconds\n\
                   FAIL! -- 15 Passed | 2 Failed | 0 Pending | 7119 Skipped\n";
        assert!(!totals(out).unwrap().clean());
    }

    #[test]
    fn no_totals_when_the_suite_never_finished() {
        assert_eq!(totals("Running Suite: Kubernetes e2e suite\n"), None);
    }

    #[test]
    fn junit_specs_with_state_time_and_message() {
        let x = r#"<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="3.2"></testcase>
<testcase name="[It] [sig-network] LoadBalancers [Feature:LoadBalancer] should handle load balancer cleanup finalizer for service [Slow]" classname="Kubernetes e2e suite" status="passed" time="21.5"><system-err>x</system-err></testcase>
<testcase name="[It] [sig-network] LoadBalancers [Feature:LoadBalancer] should only allow access from service loadbalancer source ranges [Slow]" classname="Kubernetes e2e suite" status="failed" time="310.0"><failure message="Expected &#34;a&#34;&#xA;second line" type="failed">x</failure></testcase>
<testcase name="[It] [sig-apps] Deployment other" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
<testcase name="[It] [sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] [Slow] should target all nodes with endpoints" classname="Kubernetes e2e suite" status="skipped" time="1.5"><skipped message="skipped - Test requires multiple schedulable nodes"></skipped></testcase>
</testsuite></testsuites>"#;
        let s = specs(x);
        assert_eq!(s.len(), 3, "{s:#?}");
        assert_eq!(s[0].state, State::Passed);
        assert_eq!(s[0].time, Duration::from_millis(21_500));
        assert_eq!(s[1].state, State::Failed);
        assert_eq!(s[1].message, "Expected \"a\"");
        assert_eq!(s[2].state, State::Skipped);
        assert!(s[2].message.contains("multiple schedulable nodes"));
    }
}
