//! The HTTP layer's parsers and encoders, one by one: `If-Match`, the audit log's cursors, sign-in return paths, the
//! usage report's CSV, the answers to connections past the caps, the replacement of hyper's bare 400s and the
//! problem report a panic becomes. (The crate keeps no unit tests of its own, so that the test build compiles it
//! once; these live here, beside the tests of the same code over HTTP.)

mod precondition {
    use tessera_server::http::precondition::parse;

    #[test]
    fn if_match_is_read_to_its_documented_pattern_only() {
        for (value, version) in [
            ("*", None),
            ("\"v0\"", Some(0)),
            ("\"v3\"", Some(3)),
            ("W/\"v3\"", Some(3)),
            ("\"v999999999999999999\"", Some(999_999_999_999_999_999)),
        ] {
            assert_eq!(parse(value.as_bytes()).ok(), Some(version), "{value}");
        }
        for value in [
            "",
            "v1",
            "\"v1",
            "v1\"",
            "\"v01\"",
            "\"v00\"",
            "\"v\"",
            "\"1\"",
            "\"V1\"",
            "w/\"v1\"",
            "W/v1",
            "W/\"v1",
            "\"v1\" ",
            " \"v1\"",
            "\"v1\", \"v2\"",
            "\"v+1\"",
            "\"v-1\"",
            "\"v1x\"",
            "**",
            "\"v1000000000000000000\"",
            "\"v\u{0661}\"",
        ] {
            let e = parse(value.as_bytes()).expect_err(value);
            assert_eq!(e.problem().code, "invalid_if_match", "{value}");
        }
    }
}

mod audit {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use tessera_server::http::audit::{cursor, cursor_id};

    #[test]
    fn cursors_round_trip_and_anything_else_is_refused() {
        assert_eq!(cursor_id(&cursor(42)).ok(), Some(42));
        for bad in ["", "42", "not base64!", &URL_SAFE_NO_PAD.encode("audit:-1"), &URL_SAFE_NO_PAD.encode("x:4")] {
            assert!(cursor_id(bad).is_err(), "{bad}");
        }
    }
}

mod signin {
    use tessera_server::http::signin::local_path;

    #[test]
    fn return_targets_are_local_paths_only() {
        assert_eq!(local_path(Some("/requests?state=pending")), "/requests?state=pending");
        for bad in [
            "//evil.example.com",
            "/\\evil.example.com",
            "https://evil.example.com/",
            "evil",
            "/caf\u{e9}",
            "/a\nb",
            "",
        ] {
            assert_eq!(local_path(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(local_path(None), "/");
    }
}

mod usage {
    use tessera_server::http::usage::{CSV_HEADER, csv_line, csv_report, field};
    use tessera_server::services::usage::{AllocationUsage, UsageReport};

    fn allocation(tenant: &str, util_mean: Option<f64>) -> AllocationUsage {
        AllocationUsage {
            allocation: "a1".into(),
            request: "r1".into(),
            tenant_id: "t1".into(),
            tenant: tenant.into(),
            node: "node-1".into(),
            gpu_uuid: "GPU-1".into(),
            device_uuid: None,
            model: "H100-80GB".into(),
            profile: "1g.10gb".into(),
            weight: 1.0,
            state: "active".into(),
            from_ms: 1000,
            to_ms: 4000,
            seconds: 3.0,
            slice_seconds: 3.0,
            gpu_hours: 0.5,
            util_mean,
            idle: util_mean.is_some(),
            util_in_period: util_mean.map(|u| u * 2.0),
        }
    }

    #[test]
    fn idle_ones_come_first_then_active_ones_then_the_rest_each_by_gpu_hours() {
        let row = |id: &str, state: &str, idle: bool, gpu_hours: f64| AllocationUsage {
            allocation: id.into(),
            state: state.into(),
            idle,
            gpu_hours,
            ..allocation("t", None)
        };
        let mut list = vec![
            row("a", "released", false, 9.0),
            row("b", "active", false, 1.0),
            row("c", "active", true, 0.5),
            row("d", "active", false, 3.0),
            row("e", "active", true, 2.0),
            row("f", "released", false, 9.0),
        ];
        tessera_api::usage::attention_order(&mut list);
        let ids: Vec<&str> = list.iter().map(|a| a.allocation.as_str()).collect();
        assert_eq!(ids, ["e", "c", "d", "b", "a", "f"]);
    }

    #[test]
    fn fields_with_commas_quotes_or_line_breaks_are_quoted() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn the_report_is_a_header_and_a_line_per_allocation() {
        let report = UsageReport {
            from_ms: 0,
            to_ms: 5000,
            idle_below: 5.0,
            idle_hours: 2.0,
            tenants: Vec::new(),
            profiles: Vec::new(),
            allocations: vec![allocation("ml, vision", Some(2.5)), allocation("plain", None)],
            allocation_count: 2,
            idle_count: 0,
        };
        let text = csv_report(&report);
        let lines: Vec<&str> = text.split("\r\n").collect();
        assert_eq!(lines.len(), 4, "{text:?}");
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines[0].split(',').count(), 18);
        assert_eq!(
            lines[1],
            "\"ml, vision\",a1,r1,node-1,GPU-1,,H100-80GB,1g.10gb,1,active,1970-01-01T00:00:01Z,\
             1970-01-01T00:00:04Z,3,3,0.5,2.5,true,5"
        );
        assert_eq!(
            lines[2],
            "plain,a1,r1,node-1,GPU-1,,H100-80GB,1g.10gb,1,active,1970-01-01T00:00:01Z,1970-01-01T00:00:04Z,3,3,0.5,,\
             false,"
        );
        // Float noise is rounded away.
        let mut noisy = allocation("plain", Some(12.345_678));
        (noisy.gpu_hours, noisy.slice_seconds, noisy.weight) =
            (1_998.047_999_999_999_8 / 3600.0, 1_998.047_999_999_999_8, 1.0 / 7.0);
        let line = csv_line(&noisy);
        assert!(
            line.ends_with(",0.1429,active,1970-01-01T00:00:01Z,1970-01-01T00:00:04Z,3,1998,0.555,12.3,true,24.7"),
            "{line}"
        );
        assert_eq!(lines[3], "");
    }
}

mod listen {
    use tessera_server::http::listen::{BUSY, CROWDED};

    #[test]
    fn the_busy_and_crowded_answers_have_the_length_they_announce() {
        for (answer, status) in [(&BUSY, 503), (&CROWDED, 429)] {
            check(answer, status);
        }
    }

    fn check(answer: &[u8], status: u64) {
        let text = std::str::from_utf8(answer).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.parse().ok())
            .expect("content-length");
        assert_eq!(body.len(), length);
        let problem: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(problem["code"], "too_many_connections");
        assert_eq!(problem["status"], status);
    }
}

mod malformed {
    use tessera_server::http::malformed::replacement;

    #[test]
    fn only_hypers_own_answers_to_unparseable_requests_are_replaced() {
        let hyper = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Fri, 27 Nov 2026 10:28:01 GMT\r\n\r\n";
        let text = String::from_utf8(replacement(hyper).expect("replaced")).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("content-type: application/problem+json"), "{head}");
        let length: usize =
            head.lines().find_map(|l| l.strip_prefix("content-length: ")).expect("length").parse().expect("n");
        assert_eq!(length, body.len());
        let problem: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!((problem["status"].as_u64(), problem["code"].as_str()), (Some(400), Some("malformed_request")));
        let too_large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(
            String::from_utf8(replacement(too_large).expect("replaced")).expect("utf-8").contains("headers_too_large")
        );
        // Anything else the server writes passes as it is: answers with a body or other headers, other statuses,
        // a head followed by more bytes.
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\n\r\n{}"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nx-request-id: 1\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 1\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"\x81\x05hello",
        ] {
            assert_eq!(replacement(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}

mod error {
    use axum::http::{StatusCode, header};

    #[tokio::test]
    async fn a_panic_is_a_500_problem_report_without_its_message() {
        let response = tessera_server::http::error::panic_response(Box::new("index out of bounds: secret detail"));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        let body = axum::body::to_bytes(response.into_body(), 4096).await.expect("body");
        let problem: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(problem["code"], "internal");
        assert!(!problem.to_string().contains("secret detail"), "{problem}");
    }
}
