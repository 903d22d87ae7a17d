#include "remote_slots.h"

#include <gtest/gtest.h>

namespace stoker::python {
namespace {

TEST(RemoteSlotsTest, LocalPlacesFillFirst) {
  RemoteSlots s;
  s.Resized(3, 2);  // one local place, two remote slots
  EXPECT_FALSE(s.Take(false));
  EXPECT_TRUE(s.Take(false));
  EXPECT_TRUE(s.Take(false));
  EXPECT_EQ(s.remote_busy(), 2);
  // Everything taken (mid-resize): made locally.
  EXPECT_FALSE(s.Take(false));
  EXPECT_EQ(s.peak(), 2);
}

TEST(RemoteSlotsTest, AThreadKeepsItsPlaceWhileItMay) {
  RemoteSlots s;
  s.Resized(2, 1);
  EXPECT_FALSE(s.Take(false));  // thread A: local
  EXPECT_TRUE(s.Take(false));   // thread B: remote
  s.Done(false);                // A done; B still remote
  s.Done(true);                 // B done
  // B asks first now: it keeps its remote slot rather than the free local place.
  EXPECT_TRUE(s.Take(true));
  EXPECT_FALSE(s.Take(false));
}

TEST(RemoteSlotsTest, NoSlotsWithoutATarget) {
  RemoteSlots s;
  s.Resized(2, 0);
  EXPECT_FALSE(s.Take(true));
  EXPECT_FALSE(s.Take(true));
  EXPECT_EQ(s.peak(), 0);
}

TEST(RemoteSlotsTest, OnlyLocalPlacesClaimAWorkerBeforeTheirFirstBatch) {
  RemoteSlots s;
  s.Resized(3, 2);
  EXPECT_TRUE(s.ClaimLocal());
  EXPECT_FALSE(s.ClaimLocal());
  s.ReleaseLocal();
  EXPECT_TRUE(s.ClaimLocal());
}

TEST(RemoteSlotsTest, CapacityIsNeverNegative) {
  RemoteSlots s;
  s.set_capacity(-3);
  EXPECT_EQ(s.capacity(), 0);
  s.set_capacity(4);
  EXPECT_EQ(s.capacity(), 4);
}

}  // namespace
}  // namespace stoker::python
