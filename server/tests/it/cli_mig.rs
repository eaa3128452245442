//! `tessera mig` run as a real process: output, JSON shape and exit codes.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn tessera(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tessera");
    if let Some(text) = stdin {
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("wait")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn models_lists_the_catalog_as_a_table_and_as_json() {
    let o = tessera(&["mig", "models"], None);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    assert!(text.starts_with("MODEL"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("H100-80GB") && l.contains("Hopper")), "{text}");

    let o = tessera(&["mig", "models", "--json"], None);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let h100 = v.as_array().expect("array").iter().find(|m| m["key"] == "H100-80GB").expect("H100");
    assert_eq!(h100["compute_slices_total"], 7);
    assert!(h100["confidence"].is_string());
}

#[test]
fn profiles_shows_placements_and_accepts_nvml_names() {
    let o = tessera(&["mig", "profiles", "--model", "NVIDIA H100 80GB HBM3"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let line = text.lines().find(|l| l.starts_with("3g.40gb ")).expect("3g row");
    assert!(line.contains("{0,4}:4"), "{line}");

    let o = tessera(&["mig", "profiles", "-m", "A100-40GB", "--json"], None);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let p = &v["profiles"][0];
    assert_eq!(p["name"], "1g.5gb");
    assert_eq!(p["placements"][6], serde_json::json!([6, 1]));
    assert!(p["confidence"].is_object());

    let o = tessera(&["mig", "profiles", "--model", "T4"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown GPU model `T4`"), "{}", stderr(&o));
}

#[test]
fn validate_prints_the_placed_layout_and_exits_zero() {
    let o = tessera(&["mig", "validate", "--model", "H100-80GB", "3g.40gb@4", "2g.20gb", "1g.10gb"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(text.contains("valid layout on H100-80GB"), "{text}");
    assert!(text.contains("A  3g.40gb@4"), "{text}");

    let o = tessera(&["mig", "validate", "--model", "H100-80GB", "--json", "3g.40gb@4", "1g.10gb"], None);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["valid"], true);
    assert_eq!(v["errors"], serde_json::json!([]));
    assert_eq!(v["instances"][0], serde_json::json!({"profile": "3g.40gb", "start": 4}));
    assert_eq!(v["instances"][1]["profile"], "1g.10gb");
}

#[test]
fn validate_lists_every_problem_and_exits_one() {
    let o = tessera(
        &["mig", "validate", "--model", "A100-40GB", "3g.20gb@2", "4g.20gb@0", "2g.10gb@2", "1g.5gb+me", "1g.5gb+me"],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(text.contains("4 problems"), "{text}");
    assert!(text.contains("[mig_compute_slices_exceeded]") && text.contains("need 11 compute slices"), "{text}");
    assert!(text.contains("[mig_placement_not_allowed]") && text.contains("allowed starts are 0, 4"), "{text}");
    assert!(text.contains("[mig_overlap]") && text.contains("units 2-3"), "{text}");
    assert!(text.contains("[mig_too_many_instances]"), "{text}");

    let o = tessera(&["mig", "validate", "--model", "A100-40GB", "--json", "7g.40gb@0", "1g.5gb@6"], None);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["valid"], false);
    let codes: Vec<&str> = v["errors"].as_array().expect("errors").iter().filter_map(|e| e["code"].as_str()).collect();
    assert_eq!(codes, vec!["mig_overlap", "mig_compute_slices_exceeded"]);
    assert!(v["errors"][0]["message"].as_str().is_some_and(|m| m.contains("unit 6")));
}

#[test]
fn validate_rejects_malformed_instances_with_usage_exit() {
    let o = tessera(&["mig", "validate", "--model", "A100-40GB", "3g.20gb@four"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("must be a unit number"), "{}", stderr(&o));
}

#[test]
fn plan_reads_stdin_and_prints_the_plan() {
    let input = r#"{
        "gpus": [
            {"id": "node1/0", "model": "H100-80GB", "instances": [{"profile": "3g.40gb", "start": 0, "in_use": true}]},
            {"id": "node1/1", "model": "NVIDIA A100-SXM4-40GB", "cordoned": true}
        ],
        "demand": [{"profile": "1g.10gb", "count": 2}, {"profile": "4g.40gb", "count": 1}, {"profile": "3g.20gb", "count": 1, "model": "A100-40GB"}]
    }"#;
    let o = tessera(&["mig", "plan", "--input", "-"], Some(input));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let placed = v["placed"].as_array().expect("placed");
    assert_eq!(placed.len(), 2);
    assert!(placed.iter().all(|p| p["gpu"] == "node1/0" && p["new"] == true && p["profile"] == "1g.10gb"));
    let unplaced = v["unplaced"].as_array().expect("unplaced");
    let codes: Vec<&str> = unplaced.iter().filter_map(|u| u["code"].as_str()).collect();
    assert_eq!(codes, vec!["insufficient_capacity", "all_matching_gpus_cordoned"]);
    assert!(unplaced.iter().all(|u| u["reason"].as_str().is_some_and(|r| !r.is_empty())));
    assert_eq!(v["changed_gpus"][0]["gpu"], "node1/0");
    assert_eq!(v["changed_gpus"][0]["layout"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["destroyed"], serde_json::json!([]));
}

#[test]
fn plan_reads_a_file() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("plan.json");
    std::fs::write(
        &path,
        r#"{"gpus": [{"id": "g", "model": "A30-24GB"}], "demand": [{"profile": "2g.12gb", "count": 2}]}"#,
    )
    .expect("write");
    let o = tessera(&["mig", "plan", "--input", path.to_str().expect("utf8")], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let starts: Vec<u64> = v["placed"].as_array().expect("placed").iter().filter_map(|p| p["start"].as_u64()).collect();
    assert_eq!(starts, vec![0, 2]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_bad_input_exits_two_with_a_clear_message() {
    let cases = [
        ("{not json", "plan input is not valid"),
        (r#"{"gpus": [{"id": "g", "model": "T4"}], "demand": []}"#, "unknown GPU model `T4`"),
        (
            r#"{"gpus": [{"id": "g", "model": "H100-80GB"}], "demand": [{"profile": "5g.50gb", "count": 1}]}"#,
            "unknown MIG profile `5g.50gb`",
        ),
        (
            r#"{"gpus": [{"id": "g", "model": "H100-80GB", "instances": [{"profile": "7g.80gb", "start": 1}]}], "demand": []}"#,
            "current layout is invalid",
        ),
        (r#"{"gpus": [], "demand": [{"profile": "1g.10gb", "count": -1}]}"#, "plan input is not valid"),
        (r#"{"gpus": [], "demand": [], "gpu": []}"#, "unknown field `gpu`"),
    ];
    for (input, needle) in cases {
        let o = tessera(&["mig", "plan", "-i", "-"], Some(input));
        assert_eq!(o.status.code(), Some(2), "{input}: {}", stdout(&o));
        assert!(stderr(&o).contains(needle), "{input}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
    let o = tessera(&["mig", "plan", "--input", "/nonexistent/plan.json"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read /nonexistent/plan.json"), "{}", stderr(&o));
}

#[test]
fn layouts_lists_every_maximal_layout() {
    let o = tessera(&["mig", "layouts", "--model", "A30-24GB"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.starts_with("A30-24GB: 5 maximal layouts (base profiles)"), "{text}");
    assert!(text.lines().any(|l| l.trim() == "2g.12gb@0 2g.12gb@2"), "{text}");

    let o = tessera(&["mig", "layouts", "--model", "A30-24GB", "--all-variants", "--json"], None);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let layouts = v["layouts"].as_array().expect("layouts");
    assert!(layouts.len() > 5, "variants add layouts");
    assert!(layouts.iter().any(|l| l.as_array().is_some_and(|l| l.iter().any(|i| i["profile"] == "1g.6gb+me"))));
}

#[test]
fn migrate_creates_the_schema_and_is_idempotent() {
    let file = std::env::temp_dir().join(format!("tessera-migrate-{}.db", std::process::id()));
    let url = format!("sqlite://{}", file.display());
    for _ in 0..2 {
        let o = tessera(&["migrate", "--database-url", &url], None);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(stdout(&o), "sqlite database is up to date\n");
    }
    let o = tessera(&["migrate", "--database-url", "postgres://tessera:secret@127.0.0.1:notaport/none"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("tessera:***@127.0.0.1:notaport") && !stderr(&o).contains("secret"), "{}", stderr(&o));
    let o = tessera(&["migrate", "--database-url", "postgress://tessera:S3cret@db/x"], None);
    assert!(stderr(&o).contains("unsupported database URL scheme `postgress`"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("S3cret"), "{}", stderr(&o));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

#[test]
fn serve_settings_come_from_flags_then_environment_then_file_then_defaults() {
    use std::path::PathBuf;
    use tessera_server::config::{FileConfig, Overrides, load, resolve};

    let dir = std::env::temp_dir().join(format!("tessera-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("tessera.toml");
    std::fs::write(&file, "listen = \"0.0.0.0:9000\"\ndata_dir = \"/var/lib/tessera\"\ndemo = true\n").expect("write");
    let from_file = load(&file).expect("load");
    let no_env = |_: &str| None;
    let c = resolve(Overrides::default(), from_file.clone(), no_env).expect("settings");
    assert_eq!(
        (c.listen.as_str(), c.data_dir.clone(), c.demo),
        ("0.0.0.0:9000", PathBuf::from("/var/lib/tessera"), true)
    );
    assert_eq!(c.database_url, "sqlite:///var/lib/tessera/tessera.db");
    let flags = Overrides {
        listen: Some("127.0.0.1:1".into()),
        database_url: Some("postgres://db/t".into()),
        ..Overrides::default()
    };
    let c = resolve(flags, from_file, no_env).expect("settings");
    assert_eq!((c.listen.as_str(), c.database_url.as_str()), ("127.0.0.1:1", "postgres://db/t"));
    let c = resolve(Overrides::default(), FileConfig::default(), no_env).expect("settings");
    assert_eq!(c.listen, "127.0.0.1:8080");
    assert!(c.data_dir.ends_with("tessera") || c.data_dir.ends_with("tessera-data"), "{:?}", c.data_dir);
    std::fs::write(&file, "listen = \"x\"\ncolour = \"red\"\n").expect("write");
    assert!(load(&file).expect_err("unknown key").contains("colour"));
    let o = tessera(&["serve", "--config", file.to_str().expect("utf8")], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown field `colour`"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}
