//! Tests of the DER walker's primitives (lengths, integers, OIDs, times).

use super::*;

#[test]
fn lengths_are_minimal_and_bounded() {
    assert_eq!(length(5), vec![5]);
    assert_eq!(length(200), vec![0x81, 200]);
    assert_eq!(length(300), vec![0x82, 1, 44]);
    // a long form for a short length, a length past the end, an
    // indefinite length, a leading zero length octet: refused
    for bad in [
        &[0x04, 0x81, 0x05, 1, 2, 3, 4, 5][..],
        &[0x04, 0x05, 1, 2],
        &[0x30, 0x80, 0x04, 0x00, 0x00, 0x00],
        &[0x04, 0x82, 0x00, 0x80],
        &[0x1f, 0x01, 0x00],
    ] {
        assert!(
            Reader::new(bad, 0..bad.len()).next().is_none(),
            "{bad:02x?}"
        );
    }
    assert!(Cert::from_der(vec![0x30, 0x00]).is_err());
    // a reader never reads past its end, even when the buffer goes on
    let buf = [0x04, 0x02, 1, 2, 0x04, 0x00];
    let mut r = Reader::new(&buf, 0..3);
    assert!(r.next().is_none());
}

#[test]
fn times() {
    let der = b"\x17\x0d211020072516Z".to_vec();
    let t = Reader::new(&der, 0..der.len()).next().unwrap();
    assert_eq!(time(&t, &der), Some(1_634_714_716));
    let der = b"\x18\x0f20510101000000Z".to_vec();
    let t = Reader::new(&der, 0..der.len()).next().unwrap();
    assert_eq!(time(&t, &der), Some(2_556_144_000));
    // GeneralizedTime before 2050, fractions, offsets, signs: refused
    for bad in [
        &b"\x18\x0f20211020072516Z"[..],
        b"\x17\x0f211020072516.1Z",
        b"\x17\x0d+11020072516Z",
        b"\x17\x11211020072516+0100",
        b"\x17\x0d211320072516Z",
    ] {
        let t = Reader::new(bad, 0..bad.len()).next().unwrap();
        assert_eq!(time(&t, bad), None, "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn integers_oids_booleans_and_bits() {
    assert!(integer_ok(&[0x00, 0x80]) && integer_ok(&[0x7f]) && integer_ok(&[0xff, 0x7f]));
    assert!(!integer_ok(&[]) && !integer_ok(&[0x00, 0x7f]) && !integer_ok(&[0xff, 0x80]));
    assert_eq!(small_uint(&[0x00]), Some(0));
    assert_eq!(small_uint(&[0x00, 0xff, 0xff, 0xff, 0xff]), Some(u32::MAX));
    assert_eq!(small_uint(&[0x80]), None); // negative
    assert_eq!(small_uint(&[0x01, 0x00, 0x00, 0x00, 0x00]), None); // too big
    assert!(oid_ok(OID_SAN.as_bytes()));
    assert!(!oid_ok(&[0x55, 0x1d, 0x80, 0x11])); // padded arc
    assert!(!oid_ok(&[0x55, 0x1d, 0x91])); // unfinished arc
    assert!(!oid_ok(&[]));
    assert!(true_ok(&[0xff]) && !true_ok(&[0x01]) && !true_ok(&[0x00]) && !true_ok(&[]));
    // digitalSignature; keyCertSign + cRLSign; decipherOnly (bit 8)
    assert_eq!(named_bits(&[7, 0x80]), Some(KU_DIGITAL_SIGNATURE));
    assert_eq!(named_bits(&[1, 0x06]), Some(KU_KEY_CERT_SIGN | 1 << 6));
    assert_eq!(named_bits(&[7, 0x00, 0x80]), Some(1 << 8));
    // trailing zero bits kept, unused bits set, no bits, unused > 7
    assert_eq!(named_bits(&[0, 0x80]), None);
    assert_eq!(named_bits(&[7, 0x81]), None);
    assert_eq!(named_bits(&[0]), None);
    assert_eq!(named_bits(&[8, 0x80]), None);
}

#[test]
fn basic_constraints_are_der() {
    let bc = |b: &[u8]| basic_constraints(b);
    assert_eq!(
        bc(&[0x30, 0x00]),
        Some(BasicConstraints {
            ca: false,
            path_len: None
        })
    );
    assert_eq!(
        bc(&[0x30, 0x06, 0x01, 0x01, 0xff, 0x02, 0x01, 0x00]),
        Some(BasicConstraints {
            ca: true,
            path_len: Some(0)
        })
    );
    // cA FALSE encoded, cA not 0xff, a path length without cA, a
    // negative path length, trailing data
    for bad in [
        &[0x30, 0x03, 0x01, 0x01, 0x00][..],
        &[0x30, 0x03, 0x01, 0x01, 0x01],
        &[0x30, 0x03, 0x02, 0x01, 0x00],
        &[0x30, 0x06, 0x01, 0x01, 0xff, 0x02, 0x01, 0xff],
        &[0x30, 0x00, 0x00],
    ] {
        assert_eq!(bc(bad), None, "{bad:02x?}");
    }
}
