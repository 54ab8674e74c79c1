<!-- An adult learner; the whole profile comes from cached modules, only the arguments are new. -->
<prompt schema="tutoring">
  <student name="Amara" interests="gardening and her work as a nurse"/>
  <adult-education/>
  <biology/>
  <beginner/>
  <auditory/>
  <oral/>
  <user>
    Explain how photosynthesis and cellular respiration are connected, and where the mass of a tree
    really comes from.
  </user>
</prompt>
