//! The unit tests of [`crate::check`]: what-if and time arguments, sizes.

use super::render::human_bytes;
use super::*;

#[test]
fn what_if_forms() {
    assert_eq!(
        parse_what_if("delete machine/m-1"),
        Ok(WhatIf::DeleteMachine { name: "m-1".into() })
    );
    assert_eq!(
        parse_what_if("  delete   machines.cluster.x-k8s.io/m-1 "),
        Ok(WhatIf::DeleteMachine { name: "m-1".into() })
    );
    assert_eq!(
        parse_what_if("scale kcp/k 5"),
        Ok(WhatIf::ScaleKcp {
            name: "k".into(),
            replicas: 5
        })
    );
    assert_eq!(
        parse_what_if("scale kubeadmcontrolplanes/k --replicas=1"),
        Ok(WhatIf::ScaleKcp {
            name: "k".into(),
            replicas: 1
        })
    );
    for bad in [
        "",
        "delete machine/",
        "delete pod/x",
        "scale kcp/k",
        "scale kcp/k -1",
        "scale machine/k 3",
        "drain machine/x",
    ] {
        assert!(parse_what_if(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        WhatIf::ScaleKcp {
            name: "k".into(),
            replicas: 5
        }
        .to_string(),
        "scale kcp/k 5"
    );
}

#[test]
fn sizes() {
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(24576), "24.0 KiB");
    assert_eq!(human_bytes(2_240_512), "2.1 MiB");
}

#[test]
fn times() {
    assert_eq!(parse_time("2025-01-02T03:04:05Z"), Ok(1_735_787_045));
    assert!(parse_time("yesterday").is_err());
}
