<!-- The HotpotQA question itself: the two gold documents plus two distractors, gold ones not first. -->
<prompt schema="docqa">
  <ed-wood-film/>
  <scott-derrickson/>
  <woodson-arkansas/>
  <ed-wood/>
  <user>Were Scott Derrickson and Ed Wood of the same nationality?</user>
</prompt>
