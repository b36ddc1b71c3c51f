// Moving ZeRO's buffers from one FlatLayout to another of the same parameters (the re-lay
// after the first backward, zero_optimizer.h): a flat buffer is permuted parameter by
// parameter; a partition (this rank's chunks) is all-gathered into the old flat order first,
// since under the new layout this rank owns other elements. Padding comes out as zeros.
#pragma once

#include <ATen/core/Tensor.h>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp::zero {

// A flat buffer of layout `from` (from.total elements) laid out as `to`. No communication.
at::Tensor relay_flat(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat);

// Rank `rank`'s partition of `from` (from.partition elements) as its partition of `to`, on
// part's device. Collective over `group` when the layouts have more than one partition (every
// rank calls it with its own partition): one old bucket at a time is all-gathered on
// `collective_device` (where the group's collectives run), so that device holds at most one
// bucket beyond its own buffers whatever part's size and place (an offloaded fp32 master of
// billions of elements goes through it a bucket at a time). A local permutation otherwise.
at::Tensor relay_partition(const FlatLayout& from, const FlatLayout& to, const at::Tensor& part,
                           int rank, comm::ProcessGroup& group, c10::Device collective_device);

// Buffer t (a flat buffer of `from` when !partition, else this rank's partition) re-laid:
// a host buffer becomes a new tensor; one on an accelerator is re-laid there when the device has
// room for a second copy, else in host memory and copied back (a 16-bit model, or its gradient
// partition, sized to fit); it is written in place where the size stays, else replaced by a new
// tensor of its type there.
void relay_in_place(const FlatLayout& from, const FlatLayout& to, at::Tensor& t, bool partition,
                    int rank, comm::ProcessGroup& group, c10::Device collective_device);

// Host buffer t re-laid in its own storage, through a copy of it on `scratch`: the host never
// holds a second copy (an offloaded fp32 master of 9 B parameters is 36 GB beside 90 GB more of
// optimizer state on a 128 GiB host). False, t untouched, where the new layout has another size
// or scratch has no room for the copy; the caller then takes relay_partition's new tensor.
// Collective as relay_partition is (the same collectives in the same order).
bool relay_host_through(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t,
                        bool partition, int rank, comm::ProcessGroup& group,
                        c10::Device collective_device, c10::Device scratch);

}  // namespace dscpp::zero
