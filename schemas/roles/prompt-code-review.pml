<!-- Code in prompt text: CDATA keeps `<` from being read as the start of a tag (an import). -->
<prompt schema="roles">
  <code-reviewer/>
  <user>
    Language: Python. Please review this function.
    <![CDATA[
    def median(values):
        if len(values) < 1:
            raise ValueError("median of an empty list")
        values.sort()
        middle = len(values) // 2
        if len(values) % 2 == 1 and values[middle] >= 0:
            return values[middle]
        return (values[middle - 1] + values[middle]) / 2
    ]]>
  </user>
</prompt>
