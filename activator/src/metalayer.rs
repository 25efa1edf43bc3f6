//! The per-image metadata layer of overlay slots (placeholder).

use kubeslot_image::source::SelectedImage;
use kubeslot_image::unpack;

use crate::layers::{self, Ensured, LayerError};
use crate::paths::Root;
use crate::store::Store;

/// The lowers of an overlay slot for `image`.
pub fn ensure_slot_lowers(
    root: &Root,
    store: &Store,
    image: &SelectedImage,
    policy: &unpack::Policy,
) -> Result<Ensured, LayerError> {
    layers::ensure(root, store, image, policy)
}
