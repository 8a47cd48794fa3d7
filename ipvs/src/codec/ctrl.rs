//! The generic-netlink controller (`nlctrl`, linux/genetlink.h): resolving a
//! family's name (`IPVS`) to the message type its requests use.

use super::consts::*;
use super::{DecodeError, Writer, attrs, genl_body};

/// `CTRL_CMD_GETFAMILY` for `name` (answered with `CTRL_CMD_NEWFAMILY`, or
/// `-ENOENT` when no such family is registered: for IPVS, `ip_vs` is not loaded).
pub fn get_family(name: &str, seq: u32) -> Vec<u8> {
    Writer::new(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, seq)
        .bytes(&[CTRL_CMD_GETFAMILY, CTRL_VERSION, 0, 0])
        .string(CTRL_ATTR_FAMILY_NAME, name)
        .finish()
}

/// A `CTRL_CMD_NEWFAMILY` answer: the family's name and id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    pub id: u16,
}

impl Family {
    /// Decodes the payload of a `GENL_ID_CTRL` message.
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        const W: &str = "CTRL_CMD_NEWFAMILY";
        let (cmd, body) = genl_body(payload)?;
        if cmd != CTRL_CMD_NEWFAMILY {
            return Err(DecodeError::Value {
                what: "nlctrl command",
                value: cmd.into(),
            });
        }
        let (mut name, mut id) = (None, None);
        for a in attrs(body, W)? {
            match a.ty {
                CTRL_ATTR_FAMILY_ID => id = Some(a.u16(W)?),
                CTRL_ATTR_FAMILY_NAME => name = Some(a.string("family name")?),
                _ => {} // version, hdrsize, maxattr, ops, mcast groups
            }
        }
        Ok(Family {
            name: name.ok_or(DecodeError::Missing {
                within: W,
                attr: CTRL_ATTR_FAMILY_NAME,
            })?,
            id: id.ok_or(DecodeError::Missing {
                within: W,
                attr: CTRL_ATTR_FAMILY_ID,
            })?,
        })
    }

    /// The answer the kernel sends (for tests and the fuzz corpus).
    pub fn encode(&self, seq: u32) -> Vec<u8> {
        Writer::new(GENL_ID_CTRL, 0, seq)
            .bytes(&[CTRL_CMD_NEWFAMILY, 2, 0, 0])
            .u16(CTRL_ATTR_FAMILY_ID, self.id)
            .string(CTRL_ATTR_FAMILY_NAME, &self.name)
            .finish()
    }
}
