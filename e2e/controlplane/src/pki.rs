//! The control plane's keys and certificates, made fresh for every start: a CA, the
//! API server's serving certificate (127.0.0.1, localhost), its client certificate
//! towards kubelets and the service-account signing key pair. Clients authenticate with bearer tokens (a static token file for
//! the admin and kube-controller-manager, TokenRequest for ServiceAccounts).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

use super::Error;

/// Paths of the files written by [`Pki::write`].
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    /// kube-apiserver's client certificate towards kubelets (`kubectl logs/exec`):
    /// CN `kube-apiserver-kubelet-client`, group `system:masters`.
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
}

impl Pki {
    /// Generates everything (ECDSA P-256) into `dir`.
    /// `extra_ips` are added to the serving certificate's SANs (a lab's bridge address).
    pub(crate) fn write(dir: &Path, extra_ips: &[IpAddr]) -> Result<Pki, Error> {
        let rc = |e: rcgen::Error| Error::Pki(e.to_string());
        let ca_key = KeyPair::generate().map_err(rc)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ringlb-test-ca");
        let ca_cert = ca.self_signed(&ca_key).map_err(rc)?;

        let srv_key = KeyPair::generate().map_err(rc)?;
        let mut srv = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default.svc".to_string(),
        ])
        .map_err(rc)?;
        srv.subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        for ip in extra_ips {
            srv.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        srv.distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let srv_cert = srv.signed_by(&srv_key, &ca_cert, &ca_key).map_err(rc)?;

        let sa_key = KeyPair::generate().map_err(rc)?;

        let kc_key = KeyPair::generate().map_err(rc)?;
        let mut kc = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
        kc.distinguished_name
            .push(DnType::CommonName, "kube-apiserver-kubelet-client");
        kc.distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        let kc_cert = kc.signed_by(&kc_key, &ca_cert, &ca_key).map_err(rc)?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            kubelet_client_cert: dir.join("kubelet-client.crt"),
            kubelet_client_key: dir.join("kubelet-client.key"),
        };
        for (path, pem) in [
            (&pki.ca_cert, ca_cert.pem()),
            (&pki.serving_cert, srv_cert.pem()),
            (&pki.serving_key, srv_key.serialize_pem()),
            (&pki.sa_key, sa_key.serialize_pem()),
            (&pki.sa_pub, sa_key.public_key_pem()),
            (&pki.kubelet_client_cert, kc_cert.pem()),
            (&pki.kubelet_client_key, kc_key.serialize_pem()),
        ] {
            std::fs::write(path, pem).map_err(Error::io(format!("writing {}", path.display())))?;
        }
        Ok(pki)
    }
}
