<!-- One member of each union; both student parameters receive arguments. -->
<prompt schema="tutoring">
  <student name="Maya" interests="horses and drawing comics"/>
  <middle-school/>
  <algebra/>
  <beginner/>
  <visual/>
  <multiple-choice/>
  <user>
    Today's lesson: solving one-step linear equations such as x + 7 = 12 and 3x = 18. Start with what
    an equation is, then finish with five practice questions.
  </user>
</prompt>
